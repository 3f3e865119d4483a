"""Detection packs: images with boxes, labels and crowd flags, moved with every crop and flip."""
