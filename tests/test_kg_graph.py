"""Knowledge-graph loaders, CSR adjacency and textualisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rcn_fast.kg import (
    KnowledgeGraph,
    RELATION_TEMPLATES,
    load_conceptnet,
    load_graph,
    load_tsv,
    load_wordnet,
    normalize_relation,
    subgraph_text,
    triple_text,
    wordnet_available,
)

CONCEPTNET_SAMPLE = "\n".join([
    '/a/[/r/IsA/,/c/en/dog/,/c/en/animal/]\t/r/IsA\t/c/en/dog\t/c/en/animal\t{"weight": 2.0}',
    '/a/[/r/UsedFor/,/c/en/ice_cream/n/,/c/en/eat/]\t/r/UsedFor\t/c/en/ice_cream/n\t/c/en/eat/v/wn/consumption\t{}',
    '/a/[/r/IsA/,/c/fr/chien/,/c/fr/animal/]\t/r/IsA\t/c/fr/chien\t/c/fr/animal\t{}',
    '/a/[/r/Synonym/,/c/en/dog/,/c/de/hund/]\t/r/Synonym\t/c/en/dog\t/c/de/hund\t{}',
    '/a/[/r/ExternalURL/,/c/en/dog/,http://x/]\t/r/ExternalURL\t/c/en/dog\thttp://dbpedia.org/dog\t{}',
    '/a/[/r/dbpedia/genre/,/c/en/x/,/c/en/y/]\t/r/dbpedia/genre\t/c/en/jazz_band\t/c/en/jazz\t{}',
    '/a/[/r/AtLocation/,/c/en/dog/,/c/en/kennel/]\t/r/AtLocation\t/c/en/dog\t/c/en/kennel\t{}',
    '/a/[/r/IsA/,/c/en/dog/,/c/en/animal/]\t/r/IsA\t/c/en/dog/n\t/c/en/animal\t{"dup": true}',
]) + "\n"


def test_normalize_relation():
    assert normalize_relation("/r/IsA") == "is_a"
    assert normalize_relation("/r/dbpedia/genre") == "dbpedia_genre"
    assert normalize_relation("UsedFor") == "used_for"
    assert normalize_relation("part of") == "part_of"
    assert normalize_relation("/r/HasFirstSubevent") == "has_first_subevent"
    with pytest.raises(ValueError, match="name"):
        normalize_relation("  ")


def test_conceptnet_english_filter_and_names(tmp_path):
    f = tmp_path / "assertions.csv"
    f.write_text(CONCEPTNET_SAMPLE)
    g = load_conceptnet(f)
    triples = {g.triple(e) for e in range(g.num_edges)}
    assert triples == {("dog", "is_a", "animal"), ("ice cream", "used_for", "eat"),
                       ("jazz band", "dbpedia_genre", "jazz"), ("dog", "at_location", "kennel")}
    assert g.num_edges == 4  # the duplicate (dog/n) row collapses onto dog
    assert "chien" not in g.node_names and "hund" not in g.node_names
    g_all = load_conceptnet(f, english_only=False)
    assert ("chien", "is_a", "animal") in {g_all.triple(e) for e in range(g_all.num_edges)}
    assert load_conceptnet(f, limit=2).num_edges == 2
    with pytest.raises(FileNotFoundError, match="path"):
        load_conceptnet(tmp_path / "missing.csv")


def test_tsv_loader(tmp_path):
    f = tmp_path / "kg.tsv"
    f.write_text("# comment\nsun\tIsA\tstar\nplant\tUsedFor\tfood\n\nsun\tIsA\tstar\n")
    g = load_tsv(f)
    assert g.num_edges == 2 and g.relation_names == ["is_a", "used_for"]
    assert load_graph(f"tsv:{f}").num_edges == 2
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\n")
    with pytest.raises(ValueError, match="3 tab-separated"):
        load_tsv(bad)


def test_csr_both_directions_and_save_load(tmp_path):
    g = KnowledgeGraph.from_triples([("a", "r", "b"), ("b", "r", "c"), ("a", "s", "c"), ("c", "r", "c")])
    assert g.num_edges == 3  # self-loop dropped
    assert sorted(g.neighbors(0).tolist()) == [1, 2]
    assert sorted(g.neighbors(2).tolist()) == [0, 1]
    assert g.degree().tolist() == [2, 2, 2]
    for v in range(g.num_nodes):  # every slot's edge touches its row and its neighbour
        for s in range(g.indptr[v], g.indptr[v + 1]):
            e = g.slot_edges[s]
            assert {int(g.heads[e]), int(g.tails[e])} == {v, int(g.indices[s])}
    g.save(tmp_path / "g")
    h = KnowledgeGraph.load(tmp_path / "g")
    assert h.node_names == g.node_names and np.array_equal(h.indices, g.indices)
    assert load_graph(str(tmp_path / "g")).num_edges == 3
    with pytest.raises(ValueError, match="tails"):
        KnowledgeGraph(["a"], ["r"], [0], [0], [1])
    with pytest.raises(ValueError, match="equal lengths"):
        KnowledgeGraph(["a", "b"], ["r"], [0, 1], [0], [1])
    with pytest.raises(ValueError, match="spec"):
        load_graph("nosuch:thing")


def test_textualisation():
    g = KnowledgeGraph.from_triples([("dog", "is_a", "animal"), ("dog", "capable_of", "bark"),
                                     ("x", "weird_rel", "y")])
    assert subgraph_text(g, [0, 1]) == "dog is a kind of animal. dog can bark."
    assert triple_text("x", "weird_rel", "y") == "x weird rel y"
    assert subgraph_text(g, []) == ""
    for rel, tpl in RELATION_TEMPLATES.items():
        assert "{h}" in tpl and "{t}" in tpl, rel


WORDNET_FIXTURE = Path(__file__).parent / "septa" / "wordnet"


def test_wordnet_fixture_is_in_the_database_format():
    """The fixture follows the data.* layout: licence lines start with two
    spaces, every synset line starts with its own byte offset."""
    for f in sorted(WORDNET_FIXTURE.glob("data.*")):
        at, synsets = 0, 0
        for line in f.read_bytes().splitlines(keepends=True):
            if not line.startswith(b"  "):
                assert int(line[:8]) == at, (f.name, line[:40])
                synsets += 1
            at += len(line)
        assert synsets >= 1, f.name


def test_wordnet_parser_on_a_fixture_in_the_real_format():
    """The WordNet loader on a small database in the real data.* format
    (licence header, hex word counts, lex ids, pointers with source/target
    fields, verb frames, adjective satellites and markers), so the parser
    runs without wordnet-base installed."""
    assert wordnet_available(WORDNET_FIXTURE)
    g = load_wordnet(WORDNET_FIXTURE)
    assert g.source == f"wordnet:{WORDNET_FIXTURE}"
    assert g.num_nodes == 18 and len(set(g.node_keys)) == 18
    # the same offset in two files is two synsets (keys carry the part of speech)
    assert {"n:00000325", "v:00000325", "a:00000325", "r:00000325"} <= set(g.node_keys)
    name = dict(zip(g.node_keys, g.node_names))
    assert name["n:00000775"] == "dog"  # first lemma of dog, domestic_dog, Canis_familiaris
    assert name["n:00001306"] == "laika"  # lower-cased
    assert name["a:00000412"] == "scorching"  # satellite (s) keyed as a; "(p)" marker dropped
    assert name["v:00000437"] == "make noise"  # underscores become spaces
    triples = {g.triple(e) for e in range(g.num_edges)}
    assert triples == {
        ("animal", "hypernym", "entity"), ("canine", "hypernym", "animal"),
        ("domestic animal", "hypernym", "animal"), ("dog", "hypernym", "canine"),
        ("dog", "hypernym", "domestic animal"), ("cat", "hypernym", "animal"),
        ("dog", "member_holonym", "pack"), ("tail", "part_holonym", "dog"), ("tail", "part_holonym", "cat"),
        ("laika", "instance_hypernym", "dog"), ("bark", "hypernym", "make noise"),
        ("eat", "entailment", "chew"), ("quickly", "pertainym", "quick"),
        # symmetric pointers are listed on both synsets and kept once
        ("dog", "derivation", "bark"), ("hot", "antonym", "cold"), ("hot", "similar_to", "scorching"),
    }
    # inverse pointers (~ hyponym, %p/%m meronyms, ~i instance) are dropped
    assert not {"hyponym", "part_meronym", "member_meronym"} & set(g.relation_names)
    # one part of speech: pointers into the others are dropped
    nouns = load_wordnet(WORDNET_FIXTURE, pos=("noun",))
    assert nouns.num_nodes == 9 and all(k.startswith("n:") for k in nouns.node_keys)
    assert ("dog", "derivation", "bark") not in {nouns.triple(e) for e in range(nouns.num_edges)}
    assert load_graph(f"wordnet:{WORDNET_FIXTURE}").num_edges == g.num_edges
    assert "dog is a kind of canine" in subgraph_text(g, g.incident_edges([g.node_keys.index("n:00000775")]))


@pytest.mark.skipif(not wordnet_available(), reason="WordNet files not in /usr/share/wordnet "
                    "(apt-get install -y wordnet-base)")
def test_wordnet_graph():
    g = load_wordnet()
    assert g.num_nodes > 100_000 and g.num_edges > 150_000
    assert len(set(g.node_keys)) == g.num_nodes
    dog = g.node_keys.index("n:02084071")  # dog, domestic dog, Canis familiaris
    assert g.node_names[dog] == "dog"
    out = {g.triple(e) for e in g.incident_edges([dog])}
    assert ("dog", "hypernym", "canine") in out
    assert "hypernym" in g.relation_names and "antonym" in g.relation_names
    assert "hyponym" not in g.relation_names  # inverse pointers dropped
