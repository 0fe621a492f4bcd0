"""Retrievers: documents -> passages -> a searchable index (`retrievers.dense.DenseRetriever`, `retrievers.hybrid`),
all answering the `retrievers.base.Retriever` protocol."""
