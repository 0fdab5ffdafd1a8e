"""Approval-record fixtures of every record format the product has written:
tests/approval/records/ERA-COMMIT/*.json, made by each era's own code.

Every record says `format: 1`, but its shape changed with the main-line commits of `ERAS`
(tests/approval/records/README.md, written from `ERAS` by this tool). For each era
this tool checks that commit out in a temporary `git worktree add --detach`, and runs itself
there (`--inside`, with `PYTHONPATH` that worktree and this interpreter), so that only that
commit's code makes the records, the way its own tests made approvals:

- `cases-CASE.json`: each decision set of its tests/render/fixtures.py `CASES`, rendered by
  its `render_units`, made a plan by its `as_plan` (or, before that helper existed, E5's
  `as_plan` recipe: the decisions, the rendered units, a zero fingerprint), with the endpoint
  file in the settings' config folder;
- `plans-NAME.json`: the hand-made plans of its tests/approval/plans.py `make_plan` (a host
  vLLM and a podman endpoint), as its approval tests approved them;
- `golden-CASE-ENDPOINT.json` (from E5, when the golden units came from the real planner):
  every endpoint of every case of its tests/golden/ (tests/render/test_golden.py
  `plan_case`'s steps, the plan kept), planned by its own planner: the CPU cases, from E7
  the Instinct ones, from E8 the instance sets.

Each plan is approved by that commit's `make_approval` (approver root via sudo as alice,
`approved_at` the commit's date, `--accept-unvalidated` for the golden plans that ask for
consent) and written by its `install`, on that commit's detection of the case's catalogue
host (tests/hosts.py): the record's bytes are those the commit's install wrote to disk.

The paths: everything of a record lives under `BASE/NAME` (NAME its file's stem), a fixed
folder only root controls (the golden cases' key and token files are refused anywhere
else), so that no temporary path ever enters a record and nothing in one is rewritten:
paths, unit texts and their sha256 are as written. The tests map the unit files' install
paths (`units[*].path`) from `BASE/NAME` to their own folder where they install them.

    sudo PYTHONPATH=$PWD .venv/bin/python tests/dev/record_fixtures.py [E1 E5 ...]

Root only (BASE and the secrets); BASE must not exist and is removed afterwards. With no
era named it makes them all, replacing each era's folder; README.md is written anew from
`ERAS` and what was made. Review the diff before committing it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "tests" / "approval" / "records"
BASE = Path("/srv/epyc-llm-records")
"""Where the records' files lived while each era made them: fixed, so the bytes are stable;
root-controlled, so the golden cases' secrets are accepted."""
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Era:
    name: str
    ref: str
    changed: str


ERAS: tuple[Era, ...] = (
    Era(
        "E1",
        "b8c8ea1",
        "the first Approval (format 1): the plan as a plain dict, errors as strings, "
        "`exec_start_pre`; vllm_args without --host",
    ),
    Era("E2", "b41a53b", "`exec_condition` replaces `exec_start_pre`"),
    Era("E3", "06b4c5a", "+ `host`, `api_key_file`; vllm_args with --host"),
    Era(
        "E4",
        "b8caa50",
        "+ `omp_cpus`, `profile`, `enforce_eager`, `limit_nofile`, `limit_memlock`, "
        "`max_num_batched_tokens`; MemoryFit `kv_pool_cap_gb`",
    ),
    Era(
        "E5",
        "abcecab",
        "the plan typed (`Plan`, with `upgraded_plan`); errors are Problem objects; "
        "golden units from the real planner",
    ),
    Era("E6", "b22de91", "+ `home_read_paths`"),
    Era(
        "E7",
        "c7dd30b",
        "+ `device`, `gpus`, `gfx_version`, `tensor_parallel_size`, `gpu_fit`; "
        "HostShape `gpus` (Instinct endpoints)",
    ),
    Era("E8", "a601a89", "+ `instance`, `instances` (instance sets, nested member decisions)"),
    Era("E9", "74402cb", "MemoryFit + `runtime_gb`, `process_gb`"),
    Era("E10", "9d62682", "no new key; vllm_args + [--stream-interval N]"),
    Era("E11", "a256ce0", "Approval + `image_digest`"),
    Era("E12", "b30f55f", "+ `healing`"),
    # The newest era follows main: when a record's shape (or the renderer's output) changes,
    # pin it to the last commit of its shape and add the next era after it.
    Era(
        "E13",
        "2c92031",
        "each instance's exec_condition has `--unit NAME_N`, healing defaults changed, the "
        "renderer changed (7abb128, c72552a, 421d4cb, 14ce84c)",
    ),
    Era("E14", "b2dcb00", "+ `invocation` (the typed vLLM invocation)"),
    Era(
        "E15",
        "e2c7f75",
        "format 2: the plan holds `decisions` of one kind (`kind`: cpu, instinct, set) "
        "beside its units and fingerprints",
    ),
    Era(
        "E16",
        "fb922e9",
        "format 3: a plan stores each fact once: its words (`vllm_args`, "
        "`server_args`), dtype, address, port, served name, context, sequences, batch, OpenMP "
        "CPUs, eager and tensor parallelism are read from its typed invocation; hand-made "
        "decisions keep their words",
    ),
    Era(
        "E17",
        "main",
        "the current format, 4: one endpoint type: the decisions are the endpoint's service "
        "and what its servers share of their engine's, once, then `servers`, each only what "
        "is its own, and a set's `instances` (no members)",
    ),
)

CASE_HOSTS = {
    "genoa-podman": "genoa-9654-2s-nps4",
    "podman-before-5": "genoa-9654-2s-nps4",
    "gated-podman-token": "genoa-9654-2s-nps4",
    "podman-before-5-key": "genoa-9654-2s-nps4",
    "milan-docker": "milan-7763-2s",
    "docker-exposed-key": "milan-7763-2s",
    "host-vllm": "genoa-9654-2s-nps1",
    "host-vllm-token": "genoa-9654-2s-nps1",
    "host-ipv6-key": "genoa-9654-2s-nps1",
}
"""tests/render/fixtures.py CASES -> the catalogue host they are approved on: the host of
the golden case of the same name (the decisions are hand-written; only the host shape is
recorded from it)."""
PLANS_HOST = "genoa-9654-2s-nps1"
"""The approval tests' sandbox host (tests/approval/conftest.py)."""
PLANS = {"chat": "host", "chat-podman": "podman"}
"""tests/approval/plans.py `make_plan` endpoints -> runtime."""
PRODUCT_PYTHON = "/opt/epyc-llm/venv/bin/python"


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def era_folder(era: Era, commit: str) -> Path:
    return RECORDS / f"{era.name}-{commit[:7]}"


def child_environ(tree: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EPYCD_", "HF_", "PYTHON", "VIRTUAL_ENV"))
    }
    return keep | {
        "PYTHONPATH": str(tree),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HF_HUB_OFFLINE": "1",
        "TZ": "UTC",
    }


def make_era(era: Era) -> dict[str, Any]:
    """Make `era`'s records with its own code; returns its manifest."""
    commit = git("rev-parse", f"{era.ref}^{{commit}}")
    date = git("show", "-s", "--format=%cI", commit)
    subject = git("show", "-s", "--format=%s", commit)
    with tempfile.TemporaryDirectory(prefix=f"records-{era.name}-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        out.mkdir()
        git("worktree", "add", "--detach", str(tree), commit)
        try:
            job = {"out": str(out), "base": str(BASE), "approved_at": date}
            done = subprocess.run(
                [sys.executable, "-P", str(Path(__file__).resolve()), "--inside", json.dumps(job)],
                cwd=tree,
                env=child_environ(tree),
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"{era.name} ({commit[:7]}) failed:\n{done.stdout}{done.stderr}")
        finally:
            git("worktree", "remove", "--force", str(tree))
            shutil.rmtree(BASE, ignore_errors=True)
        made = json.loads((out / MANIFEST).read_text())
        for stale in RECORDS.glob(f"{era.name}-*"):
            shutil.rmtree(stale)
        folder = era_folder(era, commit)
        folder.mkdir(parents=True)
        for name in made:
            shutil.copyfile(out / name, folder / name)
    manifest = {
        "era": era.name,
        "commit": commit,
        "date": date,
        "subject": subject,
        "changed": era.changed,
        "base": str(BASE),
        "records": made,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# --- inside an era's worktree: only that commit's code is imported from here on ---------


def era_module(name: str) -> Any:
    """A module of the era's tree, typed Any: its API is the era's, not today's."""
    return importlib.import_module(name)


def has_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        return False
    return True


class Maker:
    """Approves plans with the era's code under BASE/NAME and collects the bytes written."""

    def __init__(self, job: dict[str, str]) -> None:
        self.out = Path(job["out"])
        self.base = Path(job["base"])
        self.approved_at = datetime.fromisoformat(job["approved_at"])
        self.manifest: dict[str, dict[str, Any]] = {}
        self.hosts = era_module("tests.hosts")
        self.detect = era_module("epycd.host.detect")
        record = era_module("epycd.approval.record")
        self.approver = record.Approver(uid=0, user="root", sudo_uid=1000, sudo_user="alice")

    def root(self, name: str) -> Path:
        root = self.base / name
        root.mkdir(parents=True, mode=0o755)
        return root

    def settings(self, root: Path) -> Any:
        """The planner tests' layout (tests/plan/conftest.py PlanWorkspace)."""
        settings = era_module("epycd.settings").Settings(
            config_dir=root / "etc-epyc-llm",
            state_dir=root / "state",
            run_dir=root / "run",
            unit_dir=root / "systemd",
            quadlet_dir=root / "containers-systemd",
            host_root=root,
        )
        settings.config_dir.mkdir(exist_ok=True)
        return settings

    def host(self, root: Path, name: str) -> Any:
        return self.detect.detect_host(
            self.hosts.make_host(root / "hosts", name), probe_runtimes=False
        )

    def approve(
        self,
        name: str,
        root: Path,
        settings: Any,
        plan: Any,
        facts: Any,
        *,
        accept: bool,
        **about: str,
    ) -> None:
        workflow = era_module("epycd.approval.workflow")
        install = era_module("epycd.approval.install")
        approval = workflow.make_approval(
            settings, plan, facts, self.approver, accepted_unvalidated=accept, now=self.approved_at
        )
        install.install(settings, approval, None)
        written = settings.state_dir / "approvals" / f"{plan.endpoint}.json"
        file = f"{name}.json"
        shutil.copyfile(written, self.out / file)
        self.manifest[file] = {
            **about,
            "endpoint": plan.endpoint,
            "root": str(root),
        }

    def cases(self) -> None:
        fixtures = era_module("tests.render.fixtures")
        render = era_module("epycd.render")
        plan_model = era_module("epycd.plan.model")
        for case, make in sorted(fixtures.CASES.items()):
            name = f"cases-{case}"
            root = self.root(name)
            settings = self.settings(root)
            decisions = make()
            config_file = settings.config_dir / f"{decisions.endpoint}.toml"
            config_file.write_text(f'model = "{decisions.model}"\n')
            if hasattr(fixtures, "units_of"):  # from E17: the endpoint of that one server
                units = fixtures.units_of(decisions)
            else:
                units = render.render_units(decisions)
            if hasattr(fixtures, "as_plan"):
                plan = fixtures.as_plan(decisions, units=units, config_file=str(config_file))
            else:  # E5's as_plan, before the helper existed
                fields = {**decisions.model_dump(), "units": units, "fingerprint": "0" * 64}
                plan = plan_model.Plan.model_validate(fields | {"config_file": str(config_file)})
            host = self.host(root, CASE_HOSTS[case])
            self.approve(
                name,
                root,
                settings,
                plan,
                host,
                accept=False,
                source="tests/render/fixtures.py CASES",
                case=case,
                host=CASE_HOSTS[case],
            )

    def plans(self) -> None:
        plans = era_module("tests.approval.plans")
        for endpoint, runtime in PLANS.items():
            name = f"plans-{endpoint}"
            root = self.root(name)
            settings = self.settings(root)
            host = self.host(root, PLANS_HOST)
            plan = plans.make_plan(endpoint, host, settings.config_dir, runtime=runtime)
            decisions = getattr(plan, "decisions", plan)  # a composed Plan from E15 on
            Path(decisions.config_file).write_text(f'model = "{decisions.model}"\n')
            self.approve(
                name,
                root,
                settings,
                plan,
                host,
                accept=False,
                source="tests/approval/plans.py make_plan",
                case=endpoint,
                host=PLANS_HOST,
            )

    def golden(self) -> None:
        """tests/render/test_golden.py `plan_case`'s steps, keeping the plans."""
        if not has_module("tests.render.test_golden"):
            return
        golden = era_module("tests.render.test_golden")
        if not hasattr(golden, "plan_case"):
            return  # the golden units were still rendered from CASES
        import tomllib

        hf_cache = era_module("tests.model.hf_cache")
        models = era_module("tests.model.models")
        conftest = era_module("tests.plan.conftest")
        facts = era_module("epycd.host.facts")
        for case in golden.CASES:
            folder = golden.GOLDEN / case
            spec = golden.GoldenCase.model_validate(
                tomllib.loads((folder / "case.toml").read_text())
            )
            stem = f"golden-{case}"
            root = self.root(stem)
            ws = conftest.PlanWorkspace(root)
            for repo_id, files in models.model_files().items():
                hf_cache.add_to_cache(ws.hf_home / "hub", repo_id, files)
            os.environ["HF_HOME"] = str(ws.hf_home)
            for relative, text in spec.secrets.items():
                secret = root / relative
                secret.parent.mkdir(parents=True, exist_ok=True)
                secret.write_text(text + "\n")
                secret.chmod(0o600)
            for endpoint in sorted(folder.glob("*.toml")):
                if endpoint.name != "case.toml":
                    text = endpoint.read_text().replace(golden.PLACEHOLDER, str(root))
                    (ws.config_dir / endpoint.name).write_text(text)

            def probe(executable: str, spec: Any = spec) -> Any:
                return facts.HostVllmFacts(path=executable, **spec.vllm.model_dump())

            host = conftest.fake_host(root, spec.host, spec.runtimes)
            results = ws.plan(host, probe=probe, product_python=golden.PRODUCT_PYTHON)
            for endpoint_name, result in sorted(results.items()):
                assert result.plan is not None, (case, endpoint_name, result.errors)
                name = f"{stem}-{endpoint_name}" if len(results) > 1 else stem
                self.approve(
                    name,
                    root,
                    ws.settings,
                    result.plan,
                    host,
                    accept=True,
                    source="tests/golden (the real planner)",
                    case=case,
                    host=spec.host,
                )

    def finish(self) -> None:
        (self.out / MANIFEST).write_text(json.dumps(self.manifest, indent=2, sort_keys=True))


def inside(job: dict[str, str]) -> None:
    maker = Maker(job)
    maker.cases()
    maker.plans()
    maker.golden()
    maker.finish()


# --- README ------------------------------------------------------------------------------


def write_readme(manifests: list[dict[str, Any]]) -> None:
    rows = []
    for m in manifests:
        kinds: dict[str, int] = {}
        for about in m["records"].values():
            source = about["source"].split(" ")[0]
            kinds[source] = kinds.get(source, 0) + 1
        made = ", ".join(f"{n} from {s}" for s, n in kinds.items())
        folder = f"{m['era']}-{m['commit'][:7]}"
        rows.append(f"| {m['era']} | `{folder}/` | {m['date'][:10]} | {m['changed']} | {made} |")
    (RECORDS / "README.md").write_text(README.format(base=BASE, rows="\n".join(rows)))


README = """# Approval records of every format the product has written

Written by `tests/dev/record_fixtures.py` (its docstring says how); do not edit by hand.
Each `ERA-COMMIT/` folder holds the records that main-line commit's own code wrote, made
the way its own tests approved plans, and a `manifest.json` saying where each comes from
(the source, the case, the catalogue host of tests/hosts.py it was approved on, and the
folder its files lived in). `expected-render/` is not generated here: it is what today's
`render_units` makes of each record's plan (tests/approval/test_records.py,
`UPDATE_RECORD_RENDER=1` rewrites it).

Records up to E14 say `format: 1`, E15 `format: 2`, E16 `format: 3`, from E17 `format: 4`;
the shape changed at each era below (main-line commits only; branch-only states never reached
an admin's disk).

| era | folder | date | what changed in a stored record | records |
|-----|--------|------|---------------------------------|---------|
{rows}

Sources: `tests/render/fixtures.py` CASES (hand-written decisions, the era's renderer;
E1-E4 had no `as_plan` helper, so the plan is made with E5's recipe: the decisions, the
rendered units, a zero fingerprint), `tests/approval/plans.py` make_plan (the approval
tests' hand-made plans), `tests/golden` (the era's real planner on the golden cases, from
E5, when the golden units started to come from the planner; Instinct cases from E7,
instance sets from E8).

Paths: each record's files (endpoint file, units, HF cache, secrets, state) lived under
`{base}/NAME` when it was made (NAME its file's stem; a golden case's endpoints share
`{base}/golden-CASE`). The path is fixed and root-controlled, so nothing in a record was
rewritten after its era's `install` wrote it: the unit texts and their sha256 are as on an
admin's disk. Tests that install the units map `units[*].path` to their own folder.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("eras", nargs="*", help="E1 ... E13 (default: all)")
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(json.loads(args.inside))
        return
    if os.geteuid() != 0:
        raise SystemExit("run as root: the records' folder and the golden secrets are root's")
    if BASE.exists():
        raise SystemExit(f"{BASE} exists: remove it first (this tool makes and removes it)")
    unknown = set(args.eras) - {era.name for era in ERAS}
    if unknown:
        raise SystemExit(f"unknown eras: {sorted(unknown)}")
    chosen = [era for era in ERAS if not args.eras or era.name in args.eras]
    for era in chosen:
        print(f"{era.name} {era.ref} ...", flush=True)
        make_era(era)
    manifests = [
        json.loads((folder / MANIFEST).read_text())
        for era in ERAS
        for folder in sorted(RECORDS.glob(f"{era.name}-*"))
    ]
    write_readme(manifests)


if __name__ == "__main__":
    main()
