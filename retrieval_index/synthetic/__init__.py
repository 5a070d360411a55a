"""A generated encyclopedia of fictional entities with multi-hop questions over it.

The world is a pure function of (passages, seed): every entity, relation, passage and question
is computed on demand from integer hashes, so the corpus streams to disk in bounded memory and
the same seed gives the same bytes. Start with :func:`synthetic_world` (Python) or
``treegym data synth`` (command line).
"""

from __future__ import annotations

from treegym.retrieval_index.synthetic.api import SyntheticWorld, synthetic_world
from treegym.retrieval_index.synthetic.questions import FAMILIES, TEMPLATES
from treegym.retrieval_index.synthetic.world import World, plan_world
from treegym.retrieval_index.synthetic.writer import Manifest, write_world

__all__ = [
    "FAMILIES",
    "TEMPLATES",
    "Manifest",
    "SyntheticWorld",
    "World",
    "plan_world",
    "synthetic_world",
    "write_world",
]
