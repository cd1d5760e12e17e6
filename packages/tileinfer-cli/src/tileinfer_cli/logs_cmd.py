"""``tileinfer logs``: the latest logged answers and chat turns, searched or as JSON."""

from __future__ import annotations

import json

from .parsing import INT32_MAX, int_range

EPILOG = """\
examples:
  tileinfer logs                      the latest 3 responses
  tileinfer logs -n 20 -q Paris       the latest 20 whose prompt or answer says Paris
  tileinfer logs --cid 4f0c2a9e1b7d3c55 --json
  tileinfer logs --path
  tileinfer chat --continue           go on with the latest conversation

Every run answer and chat turn is logged in $TILEINFER_HOME/logs.db (SQLite); --no-log on run
and chat, or TILEINFER_LOGS=0, turns that off.
"""


def add_parser(sub, formatter):
    p = sub.add_parser("logs", help="show logged answers and chat turns (SQLite)",
                       epilog=EPILOG, formatter_class=formatter)
    p.add_argument("-n", "--count", type=int_range(0, INT32_MAX), default=3, metavar="N",
                   help="how many, the latest (0: all)")
    p.add_argument("-q", "--query", metavar="TEXT",
                   help="only responses whose prompt, answer or system message holds TEXT")
    p.add_argument("--cid", metavar="ID", help="only the conversation ID")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument("--path", action="store_true", help="print the database's path and exit")
    p.set_defaults(func=run)


def run(args, out):
    from . import logs

    path = logs.db_path()
    if args.path:
        print(path, file=out)
        return 0
    rows = logs.recent(args.count, args.query, args.cid) if path.exists() else []
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=2), file=out)
        return 0
    if not rows:
        print("nothing logged" + (" matches" if args.query or args.cid else " yet"), file=out)
    for r in rows:
        tokens = f"{r['prompt_tokens']} + {r['answer_tokens']} tokens"
        print(f"# {r['datetime_utc']}  {r['command']}  conversation {r['conversation_id']}  "
              f"{r['model']} on {r['backend']}, {tokens}", file=out)
        if r["system"]:
            print(f"\n## System\n\n{r['system']}", file=out)
        print(f"\n## Prompt\n\n{r['prompt']}\n\n## Answer\n\n{r['answer']}\n", file=out)
    return 0
