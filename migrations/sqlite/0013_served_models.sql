-- Models an admin loaded while serving (`POST /admin/models`), so a
-- restart serves them again; unloading one forgets it. `path` is relative
-- to the models directory; `generation_config` is the override JSON given
-- at load ('' for none).
CREATE TABLE served_models (
    name              TEXT PRIMARY KEY,
    path              TEXT NOT NULL,
    kind              TEXT NOT NULL,
    generation_config TEXT NOT NULL DEFAULT '',
    created_at        BIGINT NOT NULL
);
