"""Text as a language model writes and counts it: Markdown structure, tokens, and the stream
that forwards only what a window keeps."""
