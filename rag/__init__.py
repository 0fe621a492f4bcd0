"""The pipeline layer: retrieve -> stack -> generate (`rag.pipeline.Pipeline`), the options every shell shares
and the LlamaIndex integration (`rag.llamaindex`). Above `retrievers` and `generators`."""
