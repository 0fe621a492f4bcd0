"""`midlens serve`: the generator as an HTTP service on Ray Serve.

    schemas     the chat completions request as accepted here; the rest of the wire format is midlens.rag.remote
    engine      requests -> prompts -> the library's answer path (rag.answering), grouped so every answer equals its
                request alone
    errors      library errors as HTTP statuses with the library's own messages
    api         the FastAPI routes (and their OpenAPI page), independent of Ray
    app         the Ray Serve deployment: one model per replica, `@serve.batch` dynamic batching onto the engine
    bench       throughput and latency against in-process batching (`midlens bench serve`)

A shell over the library: it imports `midlens.generators` and `midlens.rag`, and nothing below imports it. The
client (`midlens.rag.remote.MidlensClient`, with the response and request models both sides use) and the
LlamaIndex class a URL gives (`MidlensLLM.from_server(base_url)`, `midlens.rag.llamaindex.remote`) live in the library.
"""
