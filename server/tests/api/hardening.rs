//! Hostile input on the admin routes, in process: model paths that lead
//! out of the models directory, and load errors that would leak paths,
//! file bytes or backtraces.

use axum::http::StatusCode;
use serde_json::json;
use server::http::auth::Auth;

use crate::helpers::{app_with_models_dir, model_path};
use crate::keys::{ADMIN, call, json_of, keyed_db};

/// A models directory with one real model, a text file, a folder and
/// symlinks that point out of it.
fn hostile_models_dir() -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("synor-models-{}", uuid::Uuid::new_v4().simple()));
    let dir = root.join("models");
    std::fs::create_dir_all(dir.join("folder")).expect("dir");
    std::fs::copy(model_path("tiny/tiny.gguf"), dir.join("tiny.gguf")).expect("copy");
    std::fs::write(dir.join("notes.txt"), "SECRET-CONTENT of a file\n").expect("write");
    std::fs::write(root.join("outside.txt"), "SECRET-OUTSIDE\n").expect("write");
    std::os::unix::fs::symlink(root.join("outside.txt"), dir.join("link.gguf")).expect("link");
    std::os::unix::fs::symlink(model_path("tiny/tiny.gguf"), dir.join("real-outside.gguf"))
        .expect("link");
    dir
}

#[tokio::test]
async fn model_paths_stay_inside_the_models_directory_and_errors_leak_nothing() {
    let dir = hostile_models_dir();
    let app = app_with_models_dir(
        Auth::with_keys(keyed_db().await, Some(ADMIN.into())),
        dir.clone(),
    );
    let absolute = model_path("tiny/tiny.gguf").display().to_string();
    let outside = dir.parent().expect("root").join("outside.txt");
    let refused = [
        absolute.as_str(),
        "../outside.txt",
        "folder/../../outside.txt",
        "link.gguf",
        "real-outside.gguf",
        "/etc/passwd",
        "notes.txt",
        "folder",
        "no/such.gguf",
        "",
    ];
    for (i, path) in refused.iter().enumerate() {
        let spec = json!({"name": format!("m{i}"), "path": path});
        let r = call(&app, "POST", "/admin/models", Some(ADMIN), Some(spec)).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
        let body = json_of(r).await;
        assert_eq!(body["error"]["param"], "path", "{body}");
        let msg = body["error"]["message"].as_str().expect("message");
        for leak in [
            dir.display().to_string(),
            outside.display().to_string(),
            "SECRET".into(),
            "backtrace".into(),
            "magic".into(),
            "/tmp".into(),
        ] {
            assert!(!msg.contains(&leak), "{path}: `{msg}` leaks `{leak}`");
        }
    }
    let spec = json!({"name": "inside", "path": "./tiny.gguf"});
    let r = call(&app, "POST", "/admin/models", Some(ADMIN), Some(spec)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn every_admin_route_refuses_user_keys_and_missing_tokens() {
    let app = app_with_models_dir(
        Auth::with_keys(keyed_db().await, Some(ADMIN.into())),
        crate::helpers::models_dir(),
    );
    let created = call(
        &app,
        "POST",
        "/admin/keys",
        Some(ADMIN),
        Some(json!({"name": "user"})),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let user_key = json_of(created).await["key"]
        .as_str()
        .expect("key")
        .to_string();
    let doc: serde_json::Value =
        serde_json::from_str(&server::http::openapi::json()).expect("openapi");
    let paths = doc["paths"].as_object().expect("paths");
    let mut probed = 0;
    for (path, item) in paths.iter().filter(|(p, _)| p.starts_with("/admin")) {
        let uri = path.replace('{', "x").replace('}', "");
        for method in item.as_object().expect("item").keys() {
            let method = method.to_uppercase();
            for token in [Some(user_key.as_str()), None, Some("wrong")] {
                let r = call(&app, &method, &uri, token, Some(json!({}))).await;
                assert!(
                    matches!(
                        r.status(),
                        StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS
                    ),
                    "{method} {path} with {token:?}: {}",
                    r.status()
                );
                probed += 1;
            }
        }
    }
    assert!(probed >= 3 * 20, "only {probed} admin operations probed");
}
