"""The board's room (issue 44): one Slice record, one scan per decision, the budget, the
board file, the one victim order and the per-victim steps. Run time, standard library only."""
