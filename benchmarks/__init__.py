"""The project's benchmarks (``make bench``): each ``bench_*.py`` runs as a script and prints its figures.

A regular package, not a namespace one, so that ``benchmarks._bench`` is this folder's wherever the scripts run:
Opacus 1.6.0, a peer installed in the bench's environment, ships a top-level package of the same name, and a
regular package anywhere on the path wins over a namespace one. Each script also puts the repository first on
the path, ahead of site-packages, where that package would otherwise be found first.
"""
