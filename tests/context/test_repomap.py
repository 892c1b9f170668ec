"""The ranked repository map: what ranks first, the budget, the focus, the cache, and the
PageRank against networkx's own implementation."""

from __future__ import annotations

import random
from pathlib import Path

import pygit2
import pytest

from coder.context import repomap
from coder.context.repomap import Focus

FILES = {
    "core/models.py": (
        "class UserAccount:\n    def display_name(self):\n        return self.name\n\n"
        "def load_user_account(user_id):\n    return UserAccount()\n"
    ),
    "core/billing.py": (
        "from core.models import UserAccount, load_user_account\n\n"
        "def charge_invoice(user_id):\n    account = load_user_account(user_id)\n"
        "    return account.display_name()\n"
    ),
    "web/views.py": (
        "from core.models import load_user_account\nfrom core.billing import charge_invoice\n\n"
        "def profile_view(request):\n    return load_user_account(request.user_id)\n\n"
        "def pay_view(request):\n    return charge_invoice(request.user_id)\n"
    ),
    "web/urls.py": "from web.views import profile_view, pay_view\nROUTES = [profile_view, pay_view]\n",
    "scripts/report_builder.py": "def build_monthly_report():\n    return 'report'\n",
    "README.md": "# shop\n",
}


@pytest.fixture
def shop(make_repo) -> Path:
    return make_repo(FILES, name="shop")


def build(repo: Path, **kwargs):  # type: ignore[no-untyped-def]
    kwargs.setdefault("budget", 1000)
    return repomap.build(pygit2.Repository(str(repo)), "HEAD", **kwargs)


def test_the_most_used_definitions_come_first(shop: Path) -> None:
    m = build(shop)
    text = m.text
    assert text.startswith("core/models.py\n")  # everyone uses it
    assert "1| class UserAccount:" in text and "5| def load_user_account(user_id):" in text
    assert text.index("core/models.py") < text.index("core/billing.py") < text.index("web/urls.py")
    assert "README.md" in text.split("Other files")[1]  # no definitions: listed by name
    assert (m.files, m.cached) == (len(FILES), False)


def test_the_focus_pulls_the_task_files_up(shop: Path) -> None:
    plain = build(shop).text
    assert plain.index("core/models.py") < plain.index("scripts/report_builder.py")
    task = {
        "title": "Monthly report",
        "graph": [
            {
                "goal": "extend build_monthly_report",
                "changes": [{"path": "scripts/report_builder.py"}],
            }
        ],
    }
    focused = build(shop, focus=Focus.of_task(task)).text
    assert focused.startswith("scripts/report_builder.py\n1| def build_monthly_report():")


def test_the_budget_is_respected_and_cut_files_are_counted(make_repo) -> None:
    files = {
        f"pkg/mod{i:03}.py": f"def function_number_{i}(argument):\n    return argument\n"
        for i in range(300)
    }
    repo = make_repo(files, name="big")
    for budget in (64, 256, 1024):
        m = build(repo, budget=budget)
        assert m.tokens <= budget, (budget, m.tokens)
        assert "fs_glob lists them]" in m.text
    assert build(repo, budget=4096).definitions > build(repo, budget=256).definitions > 0


def test_the_rendered_map_is_cached_by_tree_budget_and_focus(shop: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = build(shop, cache_dir=cache)
    again = build(shop, cache_dir=cache)
    assert (first.cached, again.cached) == (False, True)
    assert again.text == first.text and (again.files, again.definitions) == (
        first.files,
        first.definitions,
    )
    assert len(list((cache / "repomap").iterdir())) == 1
    assert not build(shop, cache_dir=cache, budget=500).cached  # another budget: rebuilt
    assert not build(shop, cache_dir=cache, focus=Focus.of(["charge_invoice"])).cached
    # tags are cached per blob: a corrupt rendered map is rebuilt from them
    for path in (cache / "repomap").iterdir():
        path.write_text("garbage")
    assert build(shop, cache_dir=cache).text == first.text


def test_focus_words_are_identifiers_not_prose() -> None:
    focus = Focus.of(
        ["Add a health endpoint to app/health.py using load_user_account and UserAccount"]
    )
    assert {"load_user_account", "UserAccount", "endpoint", "health"} <= focus.words
    assert not {"Add", "a", "to", "using", "and"} & focus.words
    assert "app/health.py" in focus.files


def test_default_budget_follows_num_ctx() -> None:
    assert repomap.default_budget(32768) == 4096
    assert repomap.default_budget(2048) == 512 and repomap.default_budget(10**6) == 8192
    assert repomap.default_budget(None) == 1024


def test_pagerank_matches_networkx() -> None:
    import networkx as nx
    from networkx.algorithms.link_analysis.pagerank_alg import _pagerank_python

    rng = random.Random(7)
    n = 40
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    for _ in range(120):
        a, b = rng.randrange(n), rng.randrange(n)
        if a != b:
            graph.add_edge(a, b, weight=rng.random() + 0.1)
    personal = {i: (5.0 if i < 3 else 1.0) for i in range(n)}
    expected = _pagerank_python(graph, personalization=personal, weight="weight")
    edges = list(graph.edges(data="weight"))
    got = repomap.pagerank(n, edges, [personal[i] for i in range(n)])
    assert got == pytest.approx([expected[i] for i in range(n)], abs=1e-5)
    assert sum(got) == pytest.approx(1.0)


def test_budget_zero_is_no_map_and_parses_nothing(shop: Path, tmp_path: Path) -> None:
    m = build(shop, budget=0, cache_dir=tmp_path / "cache")
    assert (m.text, m.files, m.definitions) == ("", len(FILES), 0)
    assert not (tmp_path / "cache").exists()
    from coder.agent.prompts import NO_MAP, system_prompt

    prompt = system_prompt(repo_map="", files=6, task={"title": "t"})
    assert f'<repository files="6">\n{NO_MAP}\n</repository>' in prompt


def test_old_rendered_maps_are_pruned(shop: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for budget in (300, 400, 500, 600):
        build(shop, cache_dir=cache, budget=budget)
    folder = cache / "repomap"
    assert len(list(folder.iterdir())) == 4
    repomap._prune(folder, keep=2)
    assert len(list(folder.iterdir())) == 2
