"""The durable store: the journal's format (records.py), its files and group commit (journal.py), and what the
broker journals and recovers (store.py)."""
