-- A history database as the first release of assistd wrote it: migration m001_documents
-- only (the CREATE statements it ran, frozen here so that an edit to a shipped migration
-- shows up as a schema difference), with a scope, a document and its tokens in it.
CREATE TABLE "_assistd_migrations" (
   "name" TEXT PRIMARY KEY,
   "applied_utc" REAL
);
CREATE TABLE "scopes" (
   "root" TEXT PRIMARY KEY,
   "indexed_utc" REAL,
   "recursive" INTEGER
);
CREATE TABLE "documents" (
   "id" INTEGER PRIMARY KEY,
   "scope" TEXT NOT NULL,
   "path" TEXT NOT NULL,
   "source_kind" TEXT NOT NULL,
   "language_id" TEXT,
   "content_hash" TEXT NOT NULL,
   "num_bytes" INTEGER,
   "mtime_ns" INTEGER,
   "text" TEXT,
   "decoded_with_replacement" INTEGER,
   "created_utc" REAL,
   "updated_utc" REAL
);
CREATE UNIQUE INDEX "idx_documents_scope_source_kind_path"
    ON "documents" ("scope", "source_kind", "path");
CREATE TABLE "tokenizations" (
   "document_id" INTEGER REFERENCES "documents"("id"),
   "tokenizer_fingerprint" TEXT,
   "content_hash" TEXT,
   "token_ids" BLOB,
   "num_tokens" INTEGER,
   "created_utc" REAL,
   PRIMARY KEY ("document_id", "tokenizer_fingerprint")
);
INSERT INTO "_assistd_migrations" VALUES ('m001_documents', 0.0);
INSERT INTO "scopes" VALUES ('/r', 0.0, 1);
INSERT INTO "documents" VALUES (1, '/r', 'a.py', 'repo', 'python', 'h', 6, 0, 'x = 1
', 0, 0.0, 0.0);
INSERT INTO "tokenizations" VALUES (1, 'fp', 'h', X'010000000200000003000000', 3, 0.0);
