"""Copies Fashion-MNIST's four IDX .gz files from SOURCE to DEST, the training set cut to its first N
images and labels (the test set whole):   idx_subset.py SOURCE DEST N

IDX: a big-endian header (magic 0x00000803 for images, 0x00000801 for labels, then the item count
and, for images, rows and columns), then one unsigned byte per pixel or label, as worker/data/idx.h
reads it."""
import gzip
import os
import shutil
import struct
import sys


def cut(source, dest, count):
    with gzip.open(source, "rb") as f:
        data = f.read()
    magic, items = struct.unpack(">II", data[:8])
    dims = (magic & 0xFF) - 1  # 3 for images (then rows, columns), 1 for labels
    shape = struct.unpack(">" + "I" * dims, data[8:8 + 4 * dims])
    header = 8 + 4 * dims
    per_item = 1
    for extent in shape:
        per_item *= extent
    count = min(count, items)
    with gzip.open(dest, "wb", compresslevel=9) as out:
        out.write(struct.pack(">II", magic, count) + data[8:header])
        out.write(data[header:header + count * per_item])


def main():
    source, dest, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(dest, exist_ok=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        cut(os.path.join(source, name), os.path.join(dest, name), count)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(os.path.join(source, name), os.path.join(dest, name))


if __name__ == "__main__":
    main()
