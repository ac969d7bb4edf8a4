"""KV-cache operations: keep exactly the rows of the accepted path."""

from specgraft.cache.commit import commit_cache, commit_cache_reference

__all__ = ["commit_cache", "commit_cache_reference"]
