"""Table stages: read (files -> one DataFrame), columns (DataFrame -> typed arrays, vocabularies, statistics)."""
