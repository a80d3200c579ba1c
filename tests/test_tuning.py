"""knn_best's choice: the grid point with the best mean over the tuning seeds (training/tuning.py)."""

from __future__ import annotations

from training import evaluation as E
from training import tuning as T


def test_the_best_mean_wins_and_ties_go_to_the_first_point_in_grid_order():
    names = list(E.GRID)
    plain = [name for name in names if E.GRID[name].kind == "knn"]
    adwin = [name for name in names if E.GRID[name].kind == "knn_adwin"]
    score = {name: 0.5 for name in names}
    score[plain[7]] = score[plain[30]] = 0.9  # a tie: the earlier one is chosen
    score[adwin[3]] = 0.8
    runs = {"moons": {name: [{"cumulative": score[name] + d, "at_recovery_point": 0.4} for d in (-0.01, 0.01)]
                      for name in names}}
    table = T.sensitivity(runs, resamples=50)
    assert table["moons"]["chosen"] == {"knn_best": plain[7], "knn_adwin": adwin[3]}
    options = T.chosen_options(table)["moons"]
    assert options["knn_best"] == E.GRID[plain[7]].options and options["knn_adwin"] == E.GRID[adwin[3]].options
    text = T.sensitivity_table(table, "moons")
    assert text.count("**90.0**") == 1 and text.count("|") > 50  # the chosen point in bold, once


def test_grid_names_and_options_agree():
    for name, contestant in E.GRID.items():
        options = contestant.options
        assert name == E.grid_name(contestant.kind, options["capacity"], options["k"], options["scoped"])
    assert len(E.GRID) == 2 * 2 * len(E.KNN_CAPACITIES) * len(E.KNN_KS)
