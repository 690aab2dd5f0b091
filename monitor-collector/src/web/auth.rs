//! Every request is authenticated ([`authenticate`], a layer over the whole router, the
//! pages and unknown paths included: nothing answers a stranger but 401); each route of the
//! table then asks for a role ([`read`], [`admin`]). The 401 carries
//! `WWW-Authenticate: Basic realm="railscope"`, so a browser shows its own prompt and then
//! resends the credentials with every request of the page (the dashboard's fetches are
//! same-origin).

use std::sync::{Arc, atomic::Ordering};

use axum::{
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::MethodRouter,
};
use base64::Engine as _;

use super::{Role, WebAuth};

/// Who is calling, put on the request by [`authenticate`].
#[derive(Clone)]
pub(crate) struct Caller {
    pub role: Role,
    web: Arc<WebAuth>,
}

/// A route any authenticated caller may use.
pub(crate) fn read<S: Clone + Send + Sync + 'static>(route: MethodRouter<S>) -> MethodRouter<S> {
    // Authentication itself is every route's ([`authenticate`]): read asks no more.
    route
}

/// A route that changes the collector's state: for `admin` callers only (403 to others).
pub(crate) fn admin<S: Clone + Send + Sync + 'static>(route: MethodRouter<S>) -> MethodRouter<S> {
    route.route_layer(axum::middleware::from_fn(require_admin))
}

async fn require_admin(request: Request, next: Next) -> Response {
    match request.extensions().get::<Caller>() {
        Some(caller) if caller.role >= Role::Admin => next.run(request).await,
        caller => {
            if let Some(caller) = caller {
                caller.web.refused.forbidden.fetch_add(1, Ordering::Relaxed);
            }
            (
                StatusCode::FORBIDDEN,
                "403 Forbidden: this route is for admin users (railscope_roles in the web config)\n",
            )
                .into_response()
        }
    }
}

/// The layer over the router: admits a request with the credentials of a user of the web
/// config (or any request when the config has no users: then the listener is loopback-only,
/// or TLS verifies client certificates, or the operator allowed it), else answers 401.
pub(crate) async fn authenticate(
    State(web): State<Arc<WebAuth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let config = web.current();
    let role = if !config.has_users() {
        Some(Role::Admin)
    } else {
        match basic_credentials(request.headers()) {
            None => None,
            Some((user, password)) => match config.verified_before(&user, &password) {
                Some(role) => Some(role),
                // bcrypt is slow by design: off the server's one worker thread.
                None => tokio::task::spawn_blocking(move || config.verify(&user, &password))
                    .await
                    .ok()
                    .flatten(),
            },
        }
    };
    match role {
        Some(role) => {
            request.extensions_mut().insert(Caller {
                role,
                web: web.clone(),
            });
            next.run(request).await
        }
        None => {
            web.refused.unauthenticated.fetch_add(1, Ordering::Relaxed);
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"railscope\"")],
                "401 Unauthorized: a user and password of the collector's web config are asked for\n",
            )
                .into_response()
        }
    }
}

/// The user and password of an `Authorization: Basic` header.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// `POST /-/reload`: reads the web config file and its certificates again (as SIGHUP does);
/// 500 with the reason when the file cannot be used (the previous config stays).
pub(crate) async fn reload(State(web): State<Arc<WebAuth>>) -> Response {
    let answer = tokio::task::spawn_blocking(move || {
        web.reload().map(|()| {
            web.path().map_or_else(
                || "no web config file: nothing to reload\n".to_owned(),
                |path| format!("web config reloaded from {}\n", path.display()),
            )
        })
    })
    .await;
    match answer {
        Ok(Ok(text)) => (StatusCode::OK, text).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_read_from_the_header() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            "Basic YWxpY2U6cGE6c3M=".parse().unwrap(),
        );
        assert_eq!(
            basic_credentials(&headers),
            Some(("alice".into(), "pa:ss".into()))
        );
        headers.insert(header::AUTHORIZATION, "Bearer xyz".parse().unwrap());
        assert_eq!(basic_credentials(&headers), None);
    }
}
