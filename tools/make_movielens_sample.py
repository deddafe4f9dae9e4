#!/usr/bin/env python3
"""Writes a synthetic ratings file in MovieLens-1M's format (user::item::rating::timestamp).

For a SASRec demo without downloading ML-1M: items belong to genres laid out in a fixed order, and
each user mostly walks forward through one genre's items, sometimes jumping to another genre, so the
next item is predictable from the recent ones and the held-out last item can be ranked well.

    python3 tools/make_movielens_sample.py deploy/examples/data/ratings.dat [--users 2000] [--items 1000] [--seed 1]
"""
import argparse
import os
import random


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--genres", type=int, default=20)
    parser.add_argument("--min-ratings", type=int, default=10)
    parser.add_argument("--max-ratings", type=int, default=80)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.items < args.genres or args.items < 120:
        parser.error("--items must be at least 120 (100 test negatives) and at least --genres")

    rng = random.Random(args.seed)
    per_genre = args.items // args.genres
    lines = []
    for user in range(1, args.users + 1):
        genre = rng.randrange(args.genres)
        position = rng.randrange(per_genre)
        seen = set()
        timestamp = 956703932 + rng.randrange(10**7)
        for _ in range(rng.randint(args.min_ratings, args.max_ratings)):
            if rng.random() < 0.1:  # a jump to another genre
                genre, position = rng.randrange(args.genres), rng.randrange(per_genre)
            item = 1 + genre * per_genre + position % per_genre
            position += rng.choice((1, 1, 1, 2))
            if item in seen:
                continue
            seen.add(item)
            timestamp += rng.randint(1, 3600)
            lines.append(f"{user}::{item}::{rng.randint(1, 5)}::{timestamp}\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.path)), exist_ok=True)
    with open(args.path, "w") as out:
        out.writelines(lines)
    print(f"wrote {len(lines)} ratings by {args.users} users of {args.items} items to {args.path}")


if __name__ == "__main__":
    main()
