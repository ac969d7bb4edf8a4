"""specgraft's drafters inside other serving engines (``vllm``: vLLM ``custom_class`` proposers).

Nothing here is imported by ``import specgraft``; each integration imports its engine lazily.
"""
