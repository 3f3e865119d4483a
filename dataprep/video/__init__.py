"""The video kind: videos stored as JPEG frames at the training size with a frame index (field.py), built from
class folders or a list of files (build.py), decoded by PyAV (read.py, the `video` extra)."""
