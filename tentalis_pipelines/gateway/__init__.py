"""`tentalis serve`: an OpenAI-compatible gateway whose every call lands durably in the lakehouse.

One module per idea: ``app`` (routes), ``chat`` (chat templating and tool-call parsing), ``sampler``
(continuously batched, token-by-token decoding), ``policy`` (the serving policy, switched when the pointer
moves), ``upstream`` (forwarding to another OpenAI-compatible server), ``wal`` (the fsynced
write-ahead log and its flusher into Delta), ``landing`` (turn, session and review rows), ``auth``
(API keys and tenants), ``commands`` (the CLI), ``bridge`` (the manager-agent Bridge API's landing).
"""
