//! The query API over an archive, served on a loopback port in a thread of its own: what the
//! `railscope query` and `railscope-collector select` tests talk to.

use std::sync::Arc;

use monitor_wire::Key;

use crate::routes::{self, Sources};
use monitor_archive::archive::Archive;
use monitor_archive::query::QueryEngine;

/// Serves `archive` (frames authenticated with `key`) until the test process ends; its URL.
pub(crate) fn serve_on_loopback(archive: Archive, key: Key) -> String {
    let engine = Arc::new(QueryEngine::new(archive.reader(), key));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let _archive = archive;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let routes = routes::router(Sources {
                live: None,
                query: Some(engine),
                ..Default::default()
            });
            axum::serve(listener, routes).await.unwrap();
        });
    });
    url
}
