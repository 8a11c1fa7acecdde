"""Multi-document task shapes on a real manual: the PostgreSQL 15 HTML documentation.

Two shapes, both drawn from Debian's `postgresql-doc-15` (`corpus.pg_docs_dir`):

- `chapter`: a chapter of the manual whose material is its child pages (4-12 pages), asked as
  "Write a guide to <chapter>" with the child pages' titles as the outline. The chapter's own
  page, mostly its table of contents, is in the knowledge base but not in the material.
- `survey`: a topic spread over several pages of the SQL command reference (`sql-*.html`) or
  the client tools, asked as a user would, with a thematic outline that names no page.

Every chapter and survey below, the distractor rule and the split were written before any arm
ran on them. Chapters and surveys that overlap (the tutorial's transactions and the
transaction commands, the rule system's views and the view commands) were kept apart so that a
task's material is all of its topic the knowledge base holds: pages that would be the topic
of a survey are never distractors (`_NOT_DISTRACTORS`).

The knowledge base: every chapter's page and child pages, every survey's pages, the manual's
navigation pages (`bookindex.html`, `index.html`, `sql-commands.html`) and 40 distractor pages
chosen by sha1 of the name among the rest under 60 kB.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

CHAPTERS: tuple[str, ...] = (
    "tutorial-start.html", "tutorial-sql.html", "typeconv.html", "indexes.html",
    "performance-tips.html", "parallel-query.html", "managing-databases.html", "wal.html",
    "logical-replication.html", "jit.html", "largeobjects.html", "triggers.html",
    "event-triggers.html", "gin.html", "gist.html", "storage.html", "logicaldecoding.html",
)
NAVIGATION = ("bookindex.html", "index.html", "sql-commands.html")
N_DISTRACTORS = 40
DISTRACTOR_MAX_BYTES = 60_000
# Topics of the surveys or close to them, kept out of the distractors.
_NOT_DISTRACTORS = ("sql-", "app-", "tutorial-", "ddl", "mvcc", "rules", "plpgsql", "user-manag",
                    "role-", "backup", "maintenance", "routine-", "transaction", "xfunc",
                    "datatype", "rowtypes", "domains", "continuous-archiving")


@dataclass(frozen=True)
class Topic:
    """One multi-document task: its shape, words, outline and the pages that hold it."""

    shape: str  # "chapter" | "survey"
    name: str
    task: str
    outline: tuple[str, ...]
    pages: tuple[str, ...]


SURVEYS: tuple[Topic, ...] = (
    Topic("survey", "roles", "Write a report on how PostgreSQL manages roles and their privileges",
          ("Creating roles and their attributes", "Changing and removing roles",
           "Granting privileges on objects", "Revoking privileges", "Acting as another role"),
          ("sql-createrole.html", "sql-alterrole.html", "sql-droprole.html", "sql-grant.html",
           "sql-revoke.html", "sql-set-role.html")),
    Topic("survey", "transactions", "Write a guide to controlling transactions from SQL",
          ("Starting a transaction block", "Committing and rolling back", "Savepoints",
           "Isolation level and access mode"),
          ("sql-begin.html", "sql-commit.html", "sql-rollback.html", "sql-savepoint.html",
           "sql-rollback-to.html", "sql-release-savepoint.html", "sql-set-transaction.html")),
    Topic("survey", "cursors", "Explain how to read a large query result piece by piece with "
          "cursors", ("Declaring a cursor", "Fetching rows", "Moving without fetching",
                      "Closing and holdable cursors"),
          ("sql-declare.html", "sql-fetch.html", "sql-move.html", "sql-close.html")),
    Topic("survey", "views", "Write a guide to plain and materialized views in PostgreSQL",
          ("Defining a view", "Updatable views and check options", "Changing and dropping views",
           "Materialized views and refreshing them"),
          ("sql-createview.html", "sql-alterview.html", "sql-dropview.html",
           "sql-creatematerializedview.html", "sql-refreshmaterializedview.html")),
    Topic("survey", "prepared", "Explain how prepared statements work in PostgreSQL",
          ("Preparing a statement", "Parameters and their types", "Executing it",
           "Plan caching", "Releasing prepared statements"),
          ("sql-prepare.html", "sql-execute.html", "sql-deallocate.html")),
    Topic("survey", "maintenance", "Write a report on the SQL commands that keep a database's "
          "storage and statistics healthy",
          ("Reclaiming dead rows", "Collecting planner statistics", "Reordering a table",
           "Forcing a checkpoint", "Locks these commands take"),
          ("sql-vacuum.html", "sql-analyze.html", "sql-cluster.html", "sql-checkpoint.html")),
    Topic("survey", "notify", "Explain how sessions send each other asynchronous notifications",
          ("Listening on a channel", "Sending a notification with a payload",
           "Stopping listening", "Delivery and transactions"),
          ("sql-listen.html", "sql-notify.html", "sql-unlisten.html")),
    Topic("survey", "sequences", "Write a guide to sequence generators in PostgreSQL",
          ("Creating a sequence", "Start, increment, limits and cycling",
           "Changing a sequence", "Ownership and dropping"),
          ("sql-createsequence.html", "sql-altersequence.html", "sql-dropsequence.html")),
    Topic("survey", "schemas", "Explain how to organise database objects into schemas",
          ("Creating a schema", "Creating objects inside it", "Renaming and changing owner",
           "Dropping a schema and what it holds"),
          ("sql-createschema.html", "sql-alterschema.html", "sql-dropschema.html")),
    Topic("survey", "policies", "Write a guide to row-level security policies",
          ("Creating a policy", "Permissive and restrictive policies",
           "Policies per command", "Changing and dropping policies"),
          ("sql-createpolicy.html", "sql-alterpolicy.html", "sql-droppolicy.html")),
    Topic("survey", "dumptools", "Write a guide to backing up PostgreSQL with its command-line "
          "tools", ("Dumping one database", "Archive formats", "Restoring from an archive",
                    "Taking a base backup of a whole cluster", "Options for large databases"),
          ("app-pgdump.html", "app-pgrestore.html", "app-pgbasebackup.html")),
    Topic("survey", "types", "Write a report on defining your own data types",
          ("Domains and their constraints", "Composite types", "Enumerated types",
           "Range types", "Base types written in C"),
          ("sql-createdomain.html", "sql-createtype.html")),
)
N_TUNE = {"chapter": 6, "survey": 5}

_CHAPTER = re.compile(r'class="chapter" id="[^"]*"><div class="titlepage"><div><div>'
                      r'<h2 class="title">Chapter\s*\d+\.\s*(.*?)</h2>', re.S)
_SECT1 = re.compile(r'<span class="sect1"><a href="([^"#]+)">[\d.]+\s*(.*?)</a>', re.S)
_TAG = re.compile(r"<[^>]+>")


def _text(html: str) -> str:
    return " ".join(_TAG.sub("", html).replace("\xa0", " ").split())


def chapter(html_dir: Path, page: str) -> Topic:
    """The chapter task of `page`: its title, its child pages' titles as the outline."""
    s = (html_dir / page).read_text(encoding="utf-8")
    m = _CHAPTER.search(s)
    if m is None:
        raise ValueError(f"{page} is not a chapter page")
    toc = s[s.find('<dl class="toc">'):]
    toc = toc[:toc.find("</div>")]
    kids = _SECT1.findall(toc)
    title = _text(m.group(1))
    return Topic("chapter", page.removesuffix(".html"), f"Write a guide to {title} in PostgreSQL",
                 tuple(_text(t) for _, t in kids), tuple(dict.fromkeys(k for k, _ in kids)))


def topics(html_dir: Path) -> list[Topic]:
    return [chapter(html_dir, p) for p in CHAPTERS] + list(SURVEYS)


def split(topic: Topic, all_topics: list[Topic]) -> str:
    """tune or report: the N_TUNE topics of the shape whose sha1 of the name is smallest."""
    same = sorted((t for t in all_topics if t.shape == topic.shape),
                  key=lambda t: hashlib.sha1(t.name.encode()).hexdigest())
    return "tune" if topic.name in {t.name for t in same[:N_TUNE[topic.shape]]} else "report"


def kb_pages(html_dir: Path, all_topics: list[Topic]) -> list[str]:
    """Every page the knowledge base holds (file names), sorted."""
    wanted = set(CHAPTERS) | set(NAVIGATION)
    for t in all_topics:
        wanted.update(t.pages)
    rest = sorted((p.name for p in html_dir.glob("*.html")
                   if p.name not in wanted and not p.name.startswith(_NOT_DISTRACTORS)
                   and p.stat().st_size < DISTRACTOR_MAX_BYTES),
                  key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    return sorted(wanted | set(rest[:N_DISTRACTORS]))
