"""`midlens serve`: the generator as an HTTP service on Ray Serve, and the clients that talk to it.

    schemas     the wire format: OpenAI's chat completions with a `midlens` extension, and midlens's own endpoints
    engine      requests -> prompts -> `Generator.generate_batch`, grouped so every answer equals its request alone
    errors      library errors as HTTP statuses with the library's own messages
    api         the FastAPI routes (and their OpenAPI page), independent of Ray
    app         the Ray Serve deployment: one model per replica, `@serve.batch` dynamic batching onto the engine
    client      a plain HTTP client (no Ray, no FastAPI): answers, scores, chats, streams, with bounded retries
    llamaindex  MidlensLLM answered by a server (`MidlensLLM(base_url=...)`)
    bench       throughput and latency against in-process batching (`python -m midlens.serve.bench`)

A shell over the library: it imports `midlens.generators` and `midlens.rag`; the library does not import it, but
for `MidlensLLM(base_url=...)`, which loads `midlens.serve.llamaindex` when (and only when) a URL is given.
"""
