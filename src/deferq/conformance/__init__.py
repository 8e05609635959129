"""The conformance check: a corpus of storage directories and a runner that checks any reader.

Rules: this is a tool around the library, never imported by it (the CLI's
``deferq conformance`` handler imports it lazily). ``report`` fixes the JSON a reader prints,
``compare`` diffs two such documents, ``cases`` finds and materializes the corpus cases,
``runner`` runs a reader once per case and prints the differences, and ``deferq_reader`` is
deferq's own reader, so that CI checks the engine against the same corpus as anyone else.

Theory of operation: a case is a directory ``corpus/NAME/`` holding store files (exactly
the bytes a reader must read) and ``expected.json``; ``conformance/build_corpus.py`` in the
repository writes them reproducibly. A case too large to ship lists its big files as byte
segments in ``generated.json``; the runner writes them into the reader's copy of the case.
"""
