"""Retrieval over a passage corpus: embedders, FAISS and BM25 indexes, an HTTP server and client.

Start with :func:`open_retriever`; every retriever answers ``search(queries, k)`` for a batch.
"""

from treegym.retrieval_index.build import INDEX_TYPES, build_index, load_corpus_docs, open_retriever
from treegym.retrieval_index.corpus import Document
from treegym.retrieval_index.types import Hit, QAItem, Retriever

__all__ = ["INDEX_TYPES", "Document", "Hit", "QAItem", "Retriever", "build_index", "load_corpus_docs", "open_retriever"]
