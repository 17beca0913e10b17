//! Models an admin loaded while serving, kept so that a restart serves
//! them again (the command line's models are the command line's): saved
//! on load, forgotten on unload, read at start.

use sqlx::Row;

use super::{Db, StoreError, now};

/// A model an admin loaded: its public name, its path under the models
/// directory, `text` or `embedding`, and its sampling override (JSON,
/// empty for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedModel {
    pub name: String,
    pub path: String,
    pub kind: String,
    pub generation_config: String,
}

impl Db {
    /// Saves (or replaces) a loaded model.
    pub async fn save_model(&self, m: &SavedModel) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM served_models WHERE name = $1")
            .bind(&m.name)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO served_models (name, path, kind, generation_config, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&m.name)
        .bind(&m.path)
        .bind(&m.kind)
        .bind(&m.generation_config)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forgets a model; whether one was saved.
    pub async fn forget_model(&self, name: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM served_models WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Every saved model, oldest first.
    pub async fn saved_models(&self) -> Result<Vec<SavedModel>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, path, kind, generation_config FROM served_models \
             ORDER BY created_at, name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SavedModel {
                    name: r.try_get("name")?,
                    path: r.try_get("path")?,
                    kind: r.try_get("kind")?,
                    generation_config: r.try_get("generation_config")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn saved_models_survive_a_reconnect_and_are_forgotten_on_unload() {
        for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
            let db = Db::connect(&url).await.expect("db");
            let m = SavedModel {
                name: "extra".into(),
                path: "tiny/tiny.gguf".into(),
                kind: "text".into(),
                generation_config: r#"{"temperature":0.2}"#.into(),
            };
            db.save_model(&m).await.expect("save");
            db.save_model(&m).await.expect("save again: replaced");
            let again = Db::connect(&url).await.expect("reconnect");
            assert_eq!(again.saved_models().await.expect("list"), vec![m]);
            assert!(again.forget_model("extra").await.expect("forget"));
            assert!(!again.forget_model("extra").await.expect("forget twice"));
            assert!(again.saved_models().await.expect("list").is_empty());
        }
    }
}
