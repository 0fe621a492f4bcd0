"""Retrievers: documents -> passages -> a searchable index (`retrievers.dense.DenseRetriever`)."""
