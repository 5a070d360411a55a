"""The web layer of WebSearchQA-v0: an HTTP fetcher that survives a real network, a shared
response cache, search backends, HTML-to-text pages, and a local web for offline use."""
