"""`make demo-llm`'s semantic repetition column: a window that restates an earlier one in
other words is counted, a window on a new subject is not (real embedding model)."""

from __future__ import annotations

import math

from cdr.cli.demo_llm import restated_shares
from cdr.retrieval.embed import default_embedder

W1 = ("A deque supports appends and pops from both ends in constant time. "
      "It is the right container for a queue.")
W2_RESTATED = ("Deques support appending and popping at either end in constant time. "
               "That makes a deque the right container for a queue.")
W3_NEW = ("The datetime module supplies classes for manipulating dates and times. "
          "Timezone support comes from the tzinfo abstract base class.")


def test_restated_sentences_count_and_new_ones_do_not():
    shares = restated_shares([W1, W2_RESTATED, W3_NEW, "## Only a heading\n\n```\ncode()\n```"],
                             default_embedder())
    assert shares[0] == 0.0  # nothing earlier to restate
    assert shares[1] == 1.0  # both sentences say W1 again
    assert shares[2] == 0.0
    assert math.isnan(shares[3])  # no prose sentence to judge
