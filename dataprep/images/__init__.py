"""Image stages: decode (source bytes -> pixels), resize (pixels -> target geometry), encode (pixels -> stored bytes)."""
