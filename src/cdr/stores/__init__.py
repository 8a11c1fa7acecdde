"""Vector stores a user already has, as the knowledge base: their own vectors and payloads
read once into an in-memory fact index (`ArrayFactIndex`), nothing re-embedded.

`qdrant` opens a Qdrant collection (the local mode's storage folder, or a server on loopback)
by the address `cdr generate --ckf` and `cdr serve --ckf` take, `cdr.knowledge_base`
dispatching on the `qdrant:` scheme. The collection's embedding model is named (or the
default) and checked against the collection itself before anything ranks on it (spec §2.5):
a sample of its texts is embedded again and must come back as its stored vectors.
"""
