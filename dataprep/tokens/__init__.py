"""Text stages: read (files -> a stream of documents), tokenize (documents -> token shards)."""
