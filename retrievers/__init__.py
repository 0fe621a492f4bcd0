"""Retrievers: documents -> passages -> a searchable index (`retrievers.dense.DenseRetriever`, `retrievers.hybrid`,
`retrievers.links`, chosen by name in `retrievers.build`),
all answering the `retrievers.base.Retriever` protocol."""
