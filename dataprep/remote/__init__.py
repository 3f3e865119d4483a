"""Packs at fsspec URLs (s3://, gs://, az://, file://, memory://, ...): built to, checked, converted and
served like local packs. Kind-free; no torch; fsspec and its backends (extras s3, gcs, azure) are
imported only by urls.py, when a URL is opened."""
