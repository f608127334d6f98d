"""Relation templates (rcn_fast's own wording) and textualisation of edges.

Each normalised relation name maps to a template with ``{h}`` and ``{t}``
slots. A relation with no template falls back to ``"{h} <relation words> {t}"``.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

RELATION_TEMPLATES: dict[str, str] = {
    # ConceptNet (normalised: "/r/IsA" -> "is_a")
    "related_to": "{h} is related to {t}",
    "form_of": "{h} is a form of the word {t}",
    "is_a": "{h} is a kind of {t}",
    "part_of": "{h} is a part of {t}",
    "has_a": "{h} has {t}",
    "used_for": "{h} is used for {t}",
    "capable_of": "{h} can {t}",
    "at_location": "{h} can be found at {t}",
    "causes": "{h} causes {t}",
    "has_subevent": "{t} happens as part of {h}",
    "has_first_subevent": "{h} begins with {t}",
    "has_last_subevent": "{h} ends with {t}",
    "has_prerequisite": "{h} requires {t}",
    "has_property": "{h} is {t}",
    "motivated_by_goal": "{h} is done because of {t}",
    "obstructed_by": "{h} is blocked by {t}",
    "desires": "{h} wants {t}",
    "created_by": "{h} is made by {t}",
    "synonym": "{h} means the same as {t}",
    "antonym": "{h} is the opposite of {t}",
    "distinct_from": "{h} is not the same as {t}",
    "derived_from": "{h} comes from the word {t}",
    "symbol_of": "{h} stands for {t}",
    "defined_as": "{h} is defined as {t}",
    "manner_of": "{h} is a way of {t}",
    "located_near": "{h} is usually near {t}",
    "has_context": "{h} is a term used in {t}",
    "similar_to": "{h} is similar to {t}",
    "etymologically_related_to": "{h} shares its origin with {t}",
    "etymologically_derived_from": "{h} takes its origin from {t}",
    "causes_desire": "{h} makes you want {t}",
    "made_of": "{h} is made of {t}",
    "receives_action": "{h} can be {t}",
    "not_desires": "{h} does not want {t}",
    "not_capable_of": "{h} cannot {t}",
    "not_has_property": "{h} is not {t}",
    "not_used_for": "{h} is not used for {t}",
    "instance_of": "{h} is an instance of {t}",
    "entails": "{h} implies {t}",
    # WordNet pointer relations (rcn_fast.kg.load_wordnet)
    "hypernym": "{h} is a kind of {t}",
    "instance_hypernym": "{h} is an instance of {t}",
    "member_holonym": "{h} is a member of {t}",
    "substance_holonym": "{h} is a substance in {t}",
    "part_holonym": "{h} is a part of {t}",
    "attribute": "{h} is an attribute related to {t}",
    "derivation": "{h} is a word formed like {t}",
    "domain_topic": "{h} belongs to the topic of {t}",
    "domain_region": "{h} is used in the region {t}",
    "domain_usage": "{h} is a {t} term",
    "entailment": "doing {h} involves {t}",
    "cause": "{h} causes {t}",
    "also_see": "{h} is also like {t}",
    "verb_group": "{h} is a verb similar to {t}",
    "participle": "{h} is a participle of {t}",
    "pertainym": "{h} relates to {t}",
}


def normalize_relation(name: str) -> str:
    """``"/r/IsA"`` -> ``"is_a"``, ``"/r/dbpedia/genre"`` -> ``"dbpedia_genre"``,
    ``"UsedFor"`` -> ``"used_for"``, ``"part of"`` -> ``"part_of"``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: expected a non-empty relation name, got {name!r}")
    s = name.strip()
    if s.startswith("/r/"):
        s = s[3:]
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", s)
    s = re.sub(r"[^0-9A-Za-z]+", "_", s).strip("_").lower()
    return s


def triple_text(head: str, relation: str, tail: str, templates: dict[str, str] | None = None) -> str:
    """One sentence for ``(head, relation, tail)`` (no final full stop)."""
    tpl = (templates or RELATION_TEMPLATES).get(relation)
    if tpl is None:
        tpl = "{h} " + relation.replace("_", " ") + " {t}"
    return tpl.format(h=head, t=tail)


def edge_texts(graph, edges: Sequence[int] | np.ndarray, templates: dict[str, str] | None = None) -> list[str]:
    """One sentence per edge id of ``graph`` (a :class:`KnowledgeGraph`)."""
    out = []
    for e in np.asarray(edges, dtype=np.int64).ravel():
        out.append(triple_text(*graph.triple(int(e)), templates=templates))
    return out


def join_sentences(sentences: Iterable[str]) -> str:
    """Concatenate sentences as ``"a. b. c."`` (the paper's ⊕)."""
    parts = [s.strip().rstrip(".") for s in sentences if s and s.strip()]
    return ". ".join(parts) + ("." if parts else "")


def subgraph_text(graph, edges: Sequence[int] | np.ndarray, templates: dict[str, str] | None = None) -> str:
    """Textualise a subgraph: its edges' sentences in order, joined (eq. 2)."""
    return join_sentences(edge_texts(graph, edges, templates))
