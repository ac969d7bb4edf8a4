"""Retrieval for READER-style drafting: a short-term trie over the current token stream, long-term
suffix-array datastores over corpora, and SearchPath (Algorithm 3) that merges them into one path.

    >>> from specgraft.retrieval import TokenTrie, search_path
    >>> trie = TokenTrie(max_depth=4)
    >>> trie.extend([10, 11, 12, 13, 10, 11])
    >>> search_path([10, 11], depth=3, trie=trie).tokens
    (12, 13, 10)

Modules, in the order data flows: ``answers`` (a corpus of the target's own answers, written
with a decoder it is given), ``corpus`` (read documents), ``build`` (tokenise, sort, write a
datastore directory), ``datastore`` (memory-map and query it), ``trie`` (the stream's n-grams),
``search`` (one path from all of them). Nothing here imports torch.
"""

from specgraft.retrieval.continuations import Continuations
from specgraft.retrieval.datastore import Datastore, load_datastores, vocab_hash
from specgraft.retrieval.search import SearchPath, SearchTree, search_path, search_tree
from specgraft.retrieval.trie import TokenTrie

__all__ = [
    "Continuations", "Datastore", "SearchPath", "SearchTree", "TokenTrie", "load_datastores", "search_path", "search_tree", "vocab_hash",
]
