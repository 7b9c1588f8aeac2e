"""The "Rerun this chapter" box: the command, what a run from no checkpoint costs, and what the shown results took.
"""

from __future__ import annotations

__all__ = ["rerun_box", "results_took"]


def _count(number: int, singular: str, plural: str | None = None) -> str:
    """``1 thread``, ``2 threads``: a count with its noun in the right number."""
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def results_took(provenance: dict | None, wall: float | None = None) -> str:
    """What the results of ``provenance`` took, as a phrase: "32 min on cpu (2 worker processes of 1 thread each)",
    and, when the run resumed an interrupted one (its ``resumed`` record, or its models' own ``seconds`` summing to
    more worker time than the wall time allows), that the wall time covers only part of the work.

    ``wall``: the wall time in seconds when the provenance has none (a chapter that timed itself)."""
    from dalign_repro.report import timings

    provenance = provenance or {}
    wall = provenance.get("wall_time_s", wall)
    hardware = provenance.get("hardware", {})
    workers = int(hardware.get("workers") or 1)
    threads = int(hardware.get("threads_per_process") or 1)
    text = (f"{timings.duration(wall)}" + (f" on {provenance.get('device', 'this machine')}" if provenance else "")
            + (f" ({_count(workers, 'worker process', 'worker processes')} of {_count(threads, 'thread')} each)"
               if hardware.get("workers") else ""))
    models = [m for facts in provenance.get("families", {}).values() if isinstance(facts, dict)
              for m in facts.get("models", []) if isinstance(m, dict) and "seconds" in m and "reused_from" not in m]
    worker_seconds = sum(float(m["seconds"]) for m in models)
    resumed = provenance.get("resumed")
    if resumed:
        text += (f", resuming an interrupted run: {resumed['jobs_reused']} of its {resumed['jobs']} jobs had finished "
                 "before it started")
    if models and wall and worker_seconds > 1.1 * wall * workers:
        text += (f"; its {len(models)} models' jobs took {timings.duration(worker_seconds)} of worker time in all, "
                 "more than that wall time holds" + ("" if resumed else ", so part of them ran in an earlier, "
                                                      "interrupted sitting"))
    return text


def rerun_box(chapter: str, module: str | None, profile: str, provenance: dict | None, *, first: str = "",
              example: str = "", seconds: float | None = None, fresh: bool = True) -> str:
    """The "Rerun this chapter" box, as MyST (an admonition): the command; what a run from no checkpoint costs, at
    this profile and at the classroom profile ``lab`` (:func:`dalign_repro.report.timings.fresh_run`: measured, or
    projected by the dry run and labelled so); the wall time the shown results took, and how many of their models
    were loaded from checkpoints that existed before that run (:func:`dalign_repro.report.timings.loaded_before`); what
    must run first; how to change one parameter.

    Args:
        chapter: the notebook's stem (``"02_llama_width"``); module: the experiment (``"llama_width"``), or None.
        provenance: the provenance JSON of the chapter's main table (its ``wall_time_s`` and ``hardware``).
        first: what must run first, in words; example: a ``SET=`` value for the example override.
        seconds: the wall time when the chapter has no results table (measured in the notebook); ``fresh``: whether
            that run computed everything (False: it reused a cached model, so it is not a fresh run's cost).
    """
    from dalign_repro.report import timings
    from dalign_repro.config import default_results_dir

    lines = [f"`make notebooks ONLY={chapter} PROFILE={profile} FORCE=1` recomputes it"
             + (f" (without Jupyter: `python -m dalign_repro.experiments.{module} --profile {profile} --force`)"
                if module else "") + "."]
    cost = timings.fresh_run(chapter, profile)
    if cost is not None:
        lines.append(f"A run from no checkpoint takes {cost.sentence()}.")
    elif provenance is None and seconds is not None and fresh:
        lines.append(f"A run from nothing takes what this build of the page took: {timings.duration(seconds)}.")
        seconds = None  # said once
    else:
        lines.append("What a run from no checkpoint costs at this profile has not been measured.")
    if profile != "lab":
        lab = timings.fresh_run(chapter, "lab")
        if lab is not None:
            lines.append(f"At the classroom profile, `make notebooks ONLY={chapter} PROFILE=lab` takes "
                         f"{lab.sentence()}.")
    wall = provenance.get("wall_time_s") if provenance else seconds
    if wall is not None and wall == wall:
        lines.append(f"The results shown took {results_took(provenance, wall)}"
                     + ("" if fresh else ", with the model the page had cached") + ".")
        folder = default_results_dir(profile)
        loaded, measured = timings.loaded_before(provenance or {}, folder if folder.is_dir() else None)
        if loaded:
            lines.append(f"That run loaded {loaded} of its {measured} measured models from the checkpoints of an "
                         "earlier one instead of training them, so a fresh run takes longer.")
    lines.append(f"Needs first: {first}." if first else "Nothing must run first.")
    if example:
        lines.append(f"To change one parameter: `make notebooks ONLY={chapter} SET='{example}'` (or `--set` on the "
                     "command line); the results go to a folder of their own, never over the profile's.")
    return ":::{admonition} Rerun this chapter\n:class: note\n\n" + " ".join(lines) + "\n:::"
