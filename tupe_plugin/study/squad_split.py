"""A deterministic train/dev split of SQuAD articles, for studies without a SQuAD training file.

The articles of the file (the first ``--max-articles`` when given) are numbered from 0 in file
order; article i goes to dev when i % ``--dev-every`` == ``--dev-every`` - 1, to train otherwise
(``--dev-every 5``: articles 4, 9, 14, ... are dev, 80% of the articles train). Whole articles
move, so no passage is in both halves. Scores on such a split are not comparable with published
SQuAD dev scores: the models were fine-tuned on four fifths of the dev set.

    python -m tupe_plugin.study.squad_split --dev dev-v1.1.json --dev-every 5 --out squad-split
"""

import argparse
import json
import os


def split_articles(articles, dev_every):
    """(train, dev) lists of articles."""
    train = [a for i, a in enumerate(articles) if i % dev_every != dev_every - 1]
    dev = [a for i, a in enumerate(articles) if i % dev_every == dev_every - 1]
    return train, dev


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev", required=True, help="SQuAD JSON whose articles are split")
    parser.add_argument("--dev-every", type=int, default=5, help="every N-th article is dev (default 5)")
    parser.add_argument("--max-articles", type=int, help="split only the first N articles")
    parser.add_argument("--out", required=True, help="folder for train.json and dev.json")
    args = parser.parse_args(argv)
    if args.dev_every < 2:
        parser.error(f"--dev-every must be at least 2, got {args.dev_every}")
    try:
        with open(args.dev, encoding="utf-8") as f:
            squad = json.load(f)
        articles = squad["data"][:args.max_articles]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"--dev {args.dev}: not a SQuAD JSON file with a 'data' list ({error})")
    train, dev = split_articles(articles, args.dev_every)
    if not dev:
        parser.error(f"--dev {args.dev}: {len(articles)} article(s) leave none for dev with "
                     f"--dev-every {args.dev_every}")
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("train", train), ("dev", dev)):
        with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"version": squad.get("version", ""), "data": part}, f, ensure_ascii=False)
    questions = {name: sum(len(p["qas"]) for a in part for p in a["paragraphs"])
                 for name, part in (("train", train), ("dev", dev))}
    print(f"{len(train)} train articles ({questions['train']} questions), {len(dev)} dev articles "
          f"({questions['dev']} questions) -> {args.out}")


if __name__ == "__main__":
    main()
