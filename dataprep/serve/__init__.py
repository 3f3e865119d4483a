"""Serving: datasets over a pack held in RAM as a few contiguous buffers."""
