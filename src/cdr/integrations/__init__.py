"""Framework integrations, each an optional extra:

* `cdr.integrations.langchain` (`pip install 'cdr-retrieval[langchain]'`): a retriever bound to
  a CDR session, a writer backed by any LangChain chat model, and a runnable for the whole loop.
* `cdr.integrations.llamaindex` (`pip install 'cdr-retrieval[llamaindex]'`): a node
  postprocessor that reranks any retriever's nodes by CDR for a session, and records the
  windows written.
"""
