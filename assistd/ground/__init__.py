"""The ground floor: errors, languages, the ledger's counters, sampling parameters and
the cost model. Imports nothing of assistd, storage, proposers or editors."""
