"""The persistent history: SQLite documents and their token ids in a Target's token space."""

from storage.store import Document, HistoryStore, default_db_path

__all__ = ["Document", "HistoryStore", "default_db_path"]
