"""``search_tree`` (retrieval-only READER) and the match-length cut of ``search_path``."""

import pytest

from specgraft.retrieval import Datastore, TokenTrie, search_path, search_tree


def trie_of(stream, depth=4):
    trie = TokenTrie(max_depth=depth)
    trie.extend(stream)
    return trie


def test_best_first_by_share_product_within_nodes_depth_and_width():
    # after [1, 2]: 3 twice, 4 once; after [2, 3]: 9; after [2, 4]: 7
    trie = trie_of([1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    t = search_tree([1, 2], nodes=8, depth=2, trie=trie, key_len=3)
    paths = [t.path(i) for i in range(len(t))]
    assert paths[:2] == [(3,), (3, 9)]  # 2/3, then 2/3 x 1: the top path first
    assert set(paths) == {(3,), (3, 9), (4,), (4, 7)} and all(len(p) <= 2 for p in paths)
    assert t.scores == tuple(sorted(t.scores, reverse=True))
    assert all(p < i for i, p in enumerate(t.parents))
    assert len(search_tree([1, 2], nodes=2, depth=4, trie=trie, key_len=3)) == 2
    assert [t.path(i) for i in range(2)] == [(3,), (3, 9)]
    assert search_tree([1, 2], nodes=8, depth=1, trie=trie, key_len=3, width=1).tokens == (3,)
    # its first path is search_path's
    path = search_path([1, 2], 3, trie, key_len=3)
    deep = search_tree([1, 2], nodes=3, depth=3, trie=trie, key_len=3, width=1)
    assert deep.tokens == path.tokens and deep.sources == path.sources


def test_min_match_cuts_levels_answered_on_short_keys():
    trie = trie_of([1, 2, 3, 4, 5, 6])
    # key [9, 2]: only the one-token suffix [2] matches
    assert search_path([9, 2], 3, trie, key_len=2).tokens == (3, 4, 5)
    assert search_path([9, 2], 3, trie, key_len=2, min_match=2).tokens == ()
    # key [1, 2] matches two tokens; after 3 the key [2, 3] still does
    assert search_path([1, 2], 3, trie, key_len=2, min_match=2).tokens == (3, 4, 5)
    assert search_tree([9, 2], nodes=4, depth=3, trie=trie, key_len=2, min_match=2).tokens == ()
    with pytest.raises(ValueError, match="min_match"):
        search_path([1], 2, trie, min_match=0)


def test_sources_per_node_with_a_datastore():
    trie = trie_of([1, 2, 3, 1, 2])
    store = Datastore.from_documents([[2, 3, 8, 8], [2, 5]])
    t = search_tree([1, 2], nodes=6, depth=3, trie=trie, datastores=[store], key_len=2)
    assert t.tokens[0] == 3 and t.sources[0] == "trie"
    assert "datastore" in t.sources  # what follows [2, 3] beyond the trie comes from the store
    with pytest.raises(ValueError, match="nodes"):
        search_tree([1], nodes=-1, depth=2, trie=trie)
