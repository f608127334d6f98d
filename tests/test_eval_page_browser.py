"""The results page in a real headless browser (issue 54 item 1): Debian's
chromium driven by selenium through chromedriver (``.ci/run`` installs
them). The page opens from disk (file://) with no console error; what it
shows equals the results JSON and the checkpoint records (numbers read back
from the DOM); the filters and the pager count what the records say; a
question drills down to its probabilities and its whole trace, the
sampler's relevance and probabilities included, and an entry of a type the
page does not know is drawn as key/value. One browser session serves the
module."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("selenium", reason='the page test drives chromium with selenium (pip install "rcn_fast[dev]")')
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver; .ci/run "
                "installs them)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1300,1000")


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="rcn-page-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _open(driver, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    deadline = time.time() + 60
    while time.time() < deadline and not driver.execute_script("return document.body.dataset.ready"):
        time.sleep(0.1)
    assert driver.execute_script("return document.body.dataset.ready") == "1", driver.find_element(By.ID, "status").text


def _no_console_error(driver) -> None:
    logs = driver.get_log("browser")
    assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == [], logs


def _choose(driver, select_id: str, value) -> None:
    driver.execute_script("const s = document.getElementById(arguments[0]); s.value = String(arguments[1]);"
                          "s.dispatchEvent(new Event('change'));", select_id, value)


def _click(driver, element) -> None:
    """A real click, on the element scrolled to the middle of the window (clear of the sticky bar)."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def _count(driver) -> int:
    return int(driver.find_element(By.ID, "q-count").get_attribute("data-n"))


# ------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The demo task through vanilla, single retrieval and ReConnect (a scripted LLM, a hashing encoder):
    2 seeds, 2 orders of the choices."""
    from rcn_fast.eval import EvalConfig, evaluate
    from tests.pipelines.doubles import HashEncoder, ScriptedLLM

    out = tmp_path_factory.mktemp("page-run")
    cfg = EvalConfig(tasks=["demo"], pipelines=["vanilla", "single_retrieval", "reconnect"], model="scripted",
                     output_path=str(out), progress=False, plot=False, seeds=[0, 1], permute_choices=2)
    doc = evaluate(cfg, llm=ScriptedLLM(), encoder=HashEncoder(), print_table=False)
    records = {}
    for p, d in doc["pipelines"]["demo"].items():
        for rel in d["checkpoints"]:
            seed = int(Path(rel).name.split("-")[0][4:])
            records.setdefault(p, {})[seed] = {(r := json.loads(x))["id"]: r
                                               for x in (out / rel).read_text().splitlines()}
    return doc, out / doc["files"]["page"], records


def _gold(rec):
    p = rec["prediction"]
    return p.get("gold", p.get("answer"))


def test_the_page_opens_from_disk_and_its_numbers_are_the_json(browser, run):
    doc, page, _ = run
    _open(browser, page)
    _no_console_error(browser)
    for p, r in doc["results"]["demo"].items():
        cell = browser.find_element(By.CSS_SELECTOR, f"#results-table td[data-value]:not([data-value=''])"
                                                     f"[data-value='{r['acc']!r}']")
        assert cell.text.startswith(f"{r['acc']:.4f}")
        bar = browser.find_element(By.CSS_SELECTOR, f"#chart rect.bar[data-pipeline='{p}']")
        assert float(bar.get_attribute("data-value")) == r["acc"]
    chance = browser.find_element(By.CSS_SELECTOR, "#chart line.chance")
    assert float(chance.get_attribute("data-value")) == doc["chance"]["demo"]
    diag = doc["diagnostics"]["tasks"]["demo"]
    for series, hist in [("gold", diag["gold"])] + [(p, d["histogram"]) for p, d in diag["pipelines"].items()]:
        for label, n in hist.items():
            td = browser.find_element(By.CSS_SELECTOR, f"#hist-demo td[data-series='{series}'][data-label='{label}']")
            assert int(td.text) == n == int(td.get_attribute("data-count"))
            rect = browser.find_element(By.CSS_SELECTOR, f"svg.histogram rect[data-series='{series}']"
                                                         f"[data-label='{label}']")
            assert int(rect.get_attribute("data-count")) == n
    mb = browser.find_element(By.CSS_SELECTOR, "#hist-demo td[data-majority]")
    assert float(mb.get_attribute("data-majority")) == diag["majority_baseline"]["acc"]
    stopped = [int(td.text) for td in browser.find_elements(By.CSS_SELECTOR, "#trunc-demo td[data-truncated]")]
    assert stopped == [s["truncated"] for d in diag["pipelines"].values() for s in d["truncation"].values()]
    for p, d in diag["pipelines"].items():
        td = browser.find_element(By.XPATH, f"//table[@id='perm-demo']//tr[td[1]='{p}']/td[@data-acc]")
        assert float(td.get_attribute("data-acc")) == d["permutations"]["acc"]
    warnings = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#warnings li.warning")]
    assert warnings == doc["diagnostics"]["warnings"]
    assert doc["run"]["model"] in browser.find_element(By.ID, "model-spec").text


def test_the_filters_count_what_the_records_say(browser, run):
    doc, page, records = run
    _open(browser, page)
    pipes = list(doc["results"]["demo"])
    assert _count(browser) == 40 and len(browser.find_elements(By.CSS_SELECTOR, "tr.qrow")) == 40
    for si, seed in enumerate((0, 1)):
        _choose(browser, "seed", si)
        right = {p: {q: r["prediction"]["pred"] == _gold(r) for q, r in records[p][seed].items()} for p in pipes}
        preds = {q: {records[p][seed][q]["prediction"]["pred"] for p in pipes} for q in records[pipes[0]][seed]}
        want = {"all": 40, "disagree": sum(len(v) > 1 for v in preds.values()),
                "any-wrong": sum(not all(right[p][q] for p in pipes) for q in preds),
                "all-wrong": sum(not any(right[p][q] for p in pipes) for q in preds)}
        for f, n in want.items():
            _choose(browser, "filter", f)
            assert _count(browser) == n == len(browser.find_elements(By.CSS_SELECTOR, "tr.qrow")), (seed, f)
        _choose(browser, "filter", "pair")
        for a, b in [("reconnect", "vanilla"), ("vanilla", "reconnect"), ("single_retrieval", "reconnect")]:
            _choose(browser, "fa", pipes.index(a))
            _choose(browser, "fb", pipes.index(b))
            assert _count(browser) == sum(right[a][q] and not right[b][q] for q in preds), (seed, a, b)
        _click(browser, browser.find_element(By.ID, "swap"))
        assert _count(browser) == sum(right["reconnect"][q] and not right["single_retrieval"][q] for q in preds)
    _choose(browser, "seed", 0)
    _choose(browser, "filter", "all")
    box = browser.find_element(By.ID, "search")
    box.send_keys("demo-07")
    assert _count(browser) == 1
    box.clear()
    box.send_keys("x")  # clear() sends no input event; a key does
    box.clear()
    browser.execute_script("document.getElementById('search').dispatchEvent(new Event('input'))")
    assert _count(browser) == 40
    _no_console_error(browser)


def test_a_question_drills_down_to_its_probabilities_and_its_trace(browser, run):
    doc, page, records = run
    _open(browser, page)
    _choose(browser, "seed", 1)
    row = browser.find_elements(By.CSS_SELECTOR, "tr.qrow")[3]
    qid = row.get_attribute("data-qid")
    for p in doc["results"]["demo"]:
        rec = records[p][1][qid]["prediction"]
        assert row.find_element(By.CSS_SELECTOR, f"td.pred[data-pipeline='{p}']").text == "ABCD"[rec["pred"]]
    _click(browser, row)
    detail = browser.find_element(By.CSS_SELECTOR, f"tr.qdetail[data-qid='{qid}']")
    for p in doc["results"]["demo"]:
        lp = records[p][1][qid]["prediction"]["choice_logprobs"]
        z = sum(math.exp(x - max(lp)) for x in lp)
        shown = [float(td.get_attribute("data-p")) for td in
                 detail.find_elements(By.CSS_SELECTOR, f"td.prob[data-pipeline='{p}']")]
        assert shown == [round(math.exp(x - max(lp)) / z, 4) for x in lp]
        picked = detail.find_element(By.CSS_SELECTOR, f"td.prob.picked[data-pipeline='{p}']")
        assert int(picked.get_attribute("data-choice")) == records[p][1][qid]["prediction"]["pred"]
    gold_row = detail.find_element(By.CSS_SELECTOR, "table.choices tr.gold")
    assert int(gold_row.get_attribute("data-choice")) == _gold(records["vanilla"][1][qid])
    trace = records["reconnect"][1][qid]["prediction"]["trace"]
    box = detail.find_element(By.CSS_SELECTOR, "details.trace[data-pipeline='reconnect']")
    _click(browser, box.find_element(By.TAG_NAME, "summary"))
    deadline = time.time() + 20
    while time.time() < deadline and not box.find_elements(By.CSS_SELECTOR, ".stage"):
        time.sleep(0.1)
    stages = box.find_elements(By.CSS_SELECTOR, ".stage")
    assert [s.get_attribute("data-stage") for s in stages] == [e["stage"] for e in trace]
    assert [s.get_attribute("data-type") for s in stages] == [e["type"] for e in trace]
    first = next(e for e in trace if e["type"] == "generate")
    out = box.find_element(By.CSS_SELECTOR, f".stage[data-stage='{first['stage']}'] pre.output")
    assert out.get_attribute("textContent") == first["output"]
    retrieve = next(e for e in trace if e["type"] == "retrieve")
    shown = [li.get_attribute("textContent") for li in
             box.find_elements(By.CSS_SELECTOR, ".stage[data-type='retrieve'] ol.queries > li")]
    assert shown == retrieve["queries"]
    sample = next(e for e in trace if e["type"] == "sample")
    subsets = [li.get_attribute("textContent").split("  (")[0] for li in
               box.find_elements(By.CSS_SELECTOR, ".stage[data-type='sample'] ol.subsets > li")]
    assert subsets == [", ".join(s) for s in sample["subsets"]]
    _no_console_error(browser)


# ------------------------------------------------------------------ a larger synthetic run
@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from rcn_fast.eval.report.page import render_page
    from tests.eval_page_synthetic import synthetic_doc, synthetic_tasks

    tasks = synthetic_tasks(130, seed=3, corpus=500)
    rec = tasks["syn"].records["reconnect"][0]["q00000"]
    rec["prediction"]["trace"].append({"stage": "verifier", "type": "mystery", "votes": [1, 2], "note": "</script>x",
                                       "nested": {"deep": {"deeper": [1.5, "two"]}}})
    retrieve = next(e for e in rec["prediction"]["trace"] if e["type"] == "retrieve")
    retrieve["passages"][0]["explanations"] = ["an example's own explanation"]  # a field the page does not know
    page = tmp_path_factory.mktemp("page-syn") / "results_syn.html"
    page.write_text(render_page(synthetic_doc(tasks), tasks), encoding="utf-8")
    return tasks, page


def test_the_pager_the_sampler_and_an_unknown_entry(browser, synthetic):
    tasks, page = synthetic
    _open(browser, page)
    assert _count(browser) == 130
    sizes = []
    for _ in range(3):
        sizes.append(len(browser.find_elements(By.CSS_SELECTOR, "tr.qrow")))
        _click(browser, browser.find_element(By.ID, "next"))
    assert sizes == [50, 50, 30] and browser.find_element(By.ID, "pageinfo").text == "page 3 of 3"
    _click(browser, browser.find_element(By.ID, "prev"))
    _click(browser, browser.find_element(By.ID, "prev"))
    row = browser.find_element(By.CSS_SELECTOR, "tr.qrow[data-qid='q00000']")
    _click(browser, row)
    box = browser.find_element(By.CSS_SELECTOR, "tr.qdetail details.trace[data-pipeline='reconnect']")
    _click(browser, box.find_element(By.TAG_NAME, "summary"))
    deadline = time.time() + 20
    while time.time() < deadline and not box.find_elements(By.CSS_SELECTOR, ".stage[data-type='mystery']"):
        time.sleep(0.1)
    trace = tasks["syn"].records["reconnect"][0]["q00000"]["prediction"]["trace"]
    sample = next(e for e in trace if e["type"] == "sample")
    rows = box.find_elements(By.CSS_SELECTOR, ".stage[data-type='sample'] table.sampler tbody tr")
    cells = [[td.get_attribute("textContent") for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
    assert [c[0] for c in cells] == sample["pool"]
    assert [c[1] for c in cells] == [f"{x:.4f}" for x in sample["relevance"]]
    assert [c[2] for c in cells] == [f"{x:.4f}" for x in sample["probability"]]
    chosen = [",".join(str(j + 1) for j, s in enumerate(sample["subsets"]) if pid in s) or "-" for pid in sample["pool"]]
    assert [c[3].replace(" ", "") for c in cells] == chosen
    corpus_text = next(p["text"] for p in tasks["syn"].records["reconnect"][0]["q00000"]["prediction"]["passages"]
                       if p["id"] == sample["pool"][0])
    assert cells[0][4] == corpus_text  # the passage text, kept once per page, found by id
    ext = next(e for e in trace if e["stage"] == "knowledge_extraction")
    msgs = box.find_elements(By.CSS_SELECTOR, ".stage[data-stage='knowledge_extraction'] .msg pre")
    assert msgs[0].get_attribute("textContent") == ext["prompt"][0]["content"]  # lines quoting passages rebuilt
    kept = box.find_element(By.CSS_SELECTOR, ".stage[data-type='retrieve'] table.passages tbody tr")
    assert "an example's own explanation" in kept.get_attribute("textContent")
    mystery = box.find_element(By.CSS_SELECTOR, ".stage[data-type='mystery']")
    keys = [tr.get_attribute("data-key") for tr in mystery.find_elements(By.CSS_SELECTOR, "tr[data-key]")]
    assert keys[:3] == ["votes", "note", "nested"] and "deeper" in keys
    assert "</script>x" in mystery.get_attribute("textContent")
    _no_console_error(browser)


def test_an_open_domain_task(browser, tmp_path):
    from rcn_fast.data.open_domain import OpenQuestion
    from rcn_fast.eval.report.diagnostics import TaskRecords, diagnose
    from rcn_fast.eval.report.page import render_page

    qs = [OpenQuestion(f"o{i}", f"who wrote book {i}?", [f"author {i}"]) for i in range(3)]
    texts = {"a": ["author 0", "nobody", "author 2"], "b": ["author 0", "author 1", "someone"]}
    recs = {p: {0: {q.id: {"id": q.id, "seed": 0, "status": "ok", "elapsed_s": 0.1,
                           "metrics": {"string_em": float(t == q.answers[0]), "exact_match": float(t == q.answers[0])},
                           "prediction": {"question_id": q.id, "answer_text": t, "answers": q.answers,
                                          "trace": [{"stage": "answer", "type": "generate", "output": t,
                                                     "finish_reason": "stop", "prompt": []}]}}
                    for q, t in zip(qs, ts)}} for p, ts in texts.items()}
    tasks = {"open": TaskRecords("open", "open", qs, recs)}
    doc = {"results": {"open": {p: {"string_em": 0.5, "seeds": [0], "n_questions": 3, "n_failed": 0, "n_unlabeled": 0,
                                    "llm_calls_per_q": 1.0, "tokens_per_q": 9.0} for p in texts}},
           "configs": {"open": {"metrics": ["string_em", "exact_match"]}}, "diagnostics": diagnose(tasks)}
    page = tmp_path / "open.html"
    page.write_text(render_page(doc, tasks), encoding="utf-8")
    _open(browser, page)
    cells = [(td.get_attribute("data-pipeline"), td.text, "ok" in td.get_attribute("class").split())
             for td in browser.find_elements(By.CSS_SELECTOR, "tr.qrow td.pred")]
    assert cells == [(p, texts[p][i], texts[p][i] == f"author {i}") for i in range(3) for p in texts]
    for f, n in {"disagree": 2, "any-wrong": 2, "all-wrong": 0}.items():
        _choose(browser, "filter", f)
        assert _count(browser) == n, f
    _no_console_error(browser)
