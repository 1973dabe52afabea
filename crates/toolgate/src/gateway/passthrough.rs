//! Everything MCP besides tools, passed to the upstream that owns it: prompts, resources and
//! their templates, completions, log levels and resource subscriptions.
//!
//! The server (`crate::server`) decides what the policy lets through and audits it; this file
//! finds the upstream (by a prompt's prefixed name, or the one that lists a URI), forwards the
//! request as it came and returns the upstream's answer as it gave it: its result, an
//! `input_required` result (answered for a legacy caller, passed to a 2026-07-28 one,
//! [`super::relay`]), or its own JSON-RPC error with code, message and data kept (redacted). A
//! prompt's messages and a resource's text are read by a model or a person, so they are redacted
//! as a tool's result is, binary content kept (`corridor::redact_prompt`, `redact_resource`). Lists
//! gather every upstream that declares the feature; one that fails to list is left out and logged,
//! since a list is not a request for any one upstream's item. A result from an `initialize`-era
//! upstream gets the `resultType` 2026-07-28 requires (rmcp removes it again for legacy callers).

#![expect(
    deprecated,
    reason = "MCP 2026-07-28 deprecates logging, sampling, roots and resources/subscribe; the revisions before it, which the gateway passes through, have them"
)]

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{
    CancelTaskParams, ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult,
    GetPromptRequest, GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult,
    Prompt, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse, Reference,
    Resource, ResourceTemplate, ResultType, ServerResult, SetLevelRequest, SetLevelRequestParams,
    SubscribeRequest, SubscribeRequestParams, UnsubscribeRequest, UnsubscribeRequestParams,
    UpdateTaskParams,
};
use toolgate_core::redact::Echoes;

use super::error::PassError;
use super::relay::{Asker, Round};
use super::upstream::Upstream;
use super::{Gateway, exposed_name};
use crate::corridor::{Gate, redact_prompt, redact_resource};
use crate::toolset::{Caller, Features, PassFuture, Passthrough};

impl Passthrough for Gateway {
    fn prompts(&self) -> PassFuture<'_, Vec<Prompt>> {
        Box::pin(async move {
            let mut all = Vec::new();
            for upstream in self.offering(|c| c.prompts.is_some()) {
                let Ok(peer) = upstream.peer() else { continue };
                match peer.list_all_prompts().await {
                    Ok(prompts) => all.extend(prompts.into_iter().map(|mut p| {
                        p.name = exposed_name(upstream.name(), &p.name, self.inner.prefixed);
                        p
                    })),
                    Err(error) => {
                        tracing::warn!(upstream = upstream.name(), error = %error, "prompts/list failed; its prompts are left out");
                    }
                }
            }
            Ok(all)
        })
    }

    fn get_prompt(
        &self,
        params: GetPromptRequestParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, GetPromptResponse> {
        Box::pin(async move {
            let (upstream, own) = self
                .route(&params.name)
                .ok_or_else(|| PassError::NoPrompt {
                    name: params.name.clone(),
                })?;
            let asker = Asker {
                caller,
                gate,
                name: params.name.clone(),
                questions: None,
            };
            let own = own.to_owned();
            let echoes = Echoes::of(&serde_json::to_value(&params.arguments).unwrap_or_default());
            let build = |(responses, state): (_, _)| {
                let mut params = params.clone();
                params.name.clone_from(&own);
                params.input_responses = responses;
                params.request_state = state;
                ClientRequest::GetPromptRequest(GetPromptRequest::new(params))
            };
            let done = |result| match result {
                ServerResult::GetPromptResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    Some(result)
                }
                _ => None,
            };
            Ok(
                match upstream.request_with_input(&asker, build, done).await? {
                    Round::Done(result) => GetPromptResponse::Complete(
                        redact_prompt(asker.gate.redactor(), &echoes, result)
                            .ok_or_else(|| withheld("prompt", &asker.name))?,
                    ),
                    Round::Asks(asks) => GetPromptResponse::InputRequired(asks),
                },
            )
        })
    }

    fn resources(&self) -> PassFuture<'_, Vec<Resource>> {
        Box::pin(async move {
            let mut all = Vec::new();
            for upstream in self.offering(|c| c.resources.is_some()) {
                let Ok(peer) = upstream.peer() else { continue };
                match peer.list_all_resources().await {
                    Ok(resources) => all.extend(resources),
                    Err(error) => {
                        tracing::warn!(upstream = upstream.name(), error = %error, "resources/list failed; its resources are left out");
                    }
                }
            }
            Ok(all)
        })
    }

    fn resource_templates(&self) -> PassFuture<'_, Vec<ResourceTemplate>> {
        Box::pin(async move {
            let mut all = Vec::new();
            for upstream in self.offering(|c| c.resources.is_some()) {
                let Ok(peer) = upstream.peer() else { continue };
                match peer.list_all_resource_templates().await {
                    Ok(templates) => all.extend(templates),
                    Err(error) => {
                        tracing::warn!(upstream = upstream.name(), error = %error, "resources/templates/list failed; its templates are left out");
                    }
                }
            }
            Ok(all)
        })
    }

    fn read_resource(
        &self,
        params: ReadResourceRequestParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, ReadResourceResponse> {
        Box::pin(async move {
            let upstream = self.owner(&params.uri).await?;
            let asker = Asker {
                caller,
                gate,
                name: params.uri.clone(),
                questions: None,
            };
            let build = |(responses, state): (_, _)| {
                let mut params = params.clone();
                params.input_responses = responses;
                params.request_state = state;
                ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params))
            };
            let done = |result| match result {
                ServerResult::ReadResourceResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    Some(result)
                }
                _ => None,
            };
            Ok(
                match upstream.request_with_input(&asker, build, done).await? {
                    Round::Done(result) => ReadResourceResponse::Complete(
                        redact_resource(
                            asker.gate.redactor(),
                            &Echoes::of(&serde_json::json!({"uri": params.uri})),
                            result,
                        )
                        .ok_or_else(|| withheld("resource", &asker.name))?,
                    ),
                    Round::Asks(asks) => ReadResourceResponse::InputRequired(asks),
                },
            )
        })
    }

    fn complete(&self, mut params: CompleteRequestParams) -> PassFuture<'_, CompleteResult> {
        Box::pin(async move {
            let upstream = match &mut params.r#ref {
                Reference::Prompt(prompt) => {
                    let (upstream, own) =
                        self.route(&prompt.name)
                            .ok_or_else(|| PassError::NoPrompt {
                                name: prompt.name.clone(),
                            })?;
                    prompt.name = own.to_owned();
                    upstream
                }
                Reference::Resource(resource) => self.template_owner(&resource.uri).await?,
                _ => return Err(ErrorData::invalid_params("unknown reference type", None)),
            };
            let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
            match upstream.request(request, None).await? {
                ServerResult::CompleteResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    Ok(result)
                }
                _ => Err(unexpected(upstream, "completion/complete")),
            }
        })
    }

    /// Every upstream that logs is told the level (an `initialize`-era one by `logging/setLevel`,
    /// a 2026-07-28 one in the `_meta` of each of the session's requests); the session then
    /// receives their messages.
    fn set_level(&self, params: SetLevelRequestParams, caller: Caller) -> PassFuture<'_, ()> {
        Box::pin(async move {
            let level = serde_json::to_value(params.level).unwrap_or_default();
            for upstream in self.offering(|c| c.logging.is_some()) {
                if !upstream.speaks_modern() {
                    let request =
                        ClientRequest::SetLevelRequest(SetLevelRequest::new(params.clone()));
                    upstream.request(request, None).await?;
                }
                upstream.relay().listen(caller.peer.clone(), level.clone());
            }
            Ok(())
        })
    }

    /// The upstream is subscribed once, for the first session; every subscribed session is
    /// told of each update.
    fn subscribe(&self, params: SubscribeRequestParams, caller: Caller) -> PassFuture<'_, ()> {
        Box::pin(async move {
            let upstream = self.owner(&params.uri).await?;
            let uri = params.uri.clone();
            if upstream.relay().subscribe(uri.clone(), caller.peer.clone()) {
                let followed = if upstream.speaks_modern() {
                    upstream.follow(uri.clone()).await
                } else {
                    let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(params));
                    upstream.request(request, None).await.map(drop)
                };
                if let Err(error) = followed {
                    upstream.relay().unsubscribe(&uri, &caller.peer);
                    return Err(error);
                }
            }
            Ok(())
        })
    }

    /// The upstream is unsubscribed when the last session is.
    fn unsubscribe(&self, params: UnsubscribeRequestParams, caller: Caller) -> PassFuture<'_, ()> {
        Box::pin(async move {
            let upstream = self.owner(&params.uri).await?;
            if upstream.relay().unsubscribe(&params.uri, &caller.peer) {
                if upstream.speaks_modern() {
                    upstream.relay().unfollow(&params.uri);
                } else {
                    let request =
                        ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(params));
                    upstream.request(request, None).await?;
                }
            }
            Ok(())
        })
    }

    fn get_task(
        &self,
        params: GetTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, GetTaskResult> {
        Box::pin(Gateway::get_task(self, params, caller, gate))
    }

    fn update_task(
        &self,
        params: UpdateTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, ()> {
        Box::pin(Gateway::update_task(self, params, caller, gate))
    }

    fn cancel_task(
        &self,
        params: CancelTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, ()> {
        Box::pin(Gateway::cancel_task(self, params, caller, gate))
    }

    fn features(&self) -> Features {
        let mut features = Features::default();
        for upstream in &self.inner.upstreams {
            let Some(capabilities) = upstream.capabilities() else {
                continue;
            };
            features.completions |= capabilities.completions.is_some();
            features.logging |= capabilities.logging.is_some();
            features.subscribe |= capabilities
                .resources
                .as_ref()
                .and_then(|r| r.subscribe)
                .unwrap_or(false);
        }
        features
    }
}

impl Gateway {
    /// The connected upstreams that declare what `declares` looks for.
    fn offering(
        &self,
        declares: impl Fn(&rmcp::model::ServerCapabilities) -> bool,
    ) -> impl Iterator<Item = &Arc<Upstream>> {
        self.inner
            .upstreams
            .iter()
            .filter(move |u| u.capabilities().is_some_and(|c| declares(&c)))
    }

    /// The upstream a URI belongs to: the only one, or the one that lists it.
    async fn owner(&self, uri: &str) -> Result<&Arc<Upstream>, PassError> {
        if let [only] = self.inner.upstreams.as_slice() {
            return Ok(only);
        }
        for upstream in &self.inner.upstreams {
            let Ok(peer) = upstream.peer() else { continue };
            if peer
                .list_all_resources()
                .await
                .is_ok_and(|list| list.iter().any(|r| r.uri == uri))
            {
                return Ok(upstream);
            }
        }
        Err(PassError::NoResource {
            uri: uri.to_owned(),
        })
    }

    /// The upstream a URI template belongs to: the only one, or the one that lists it.
    async fn template_owner(&self, template: &str) -> Result<&Arc<Upstream>, PassError> {
        if let [only] = self.inner.upstreams.as_slice() {
            return Ok(only);
        }
        for upstream in &self.inner.upstreams {
            let Ok(peer) = upstream.peer() else { continue };
            if peer
                .list_all_resource_templates()
                .await
                .is_ok_and(|list| list.iter().any(|t| t.uri_template == template))
            {
                return Ok(upstream);
            }
        }
        Err(PassError::NoResource {
            uri: template.to_owned(),
        })
    }
}

/// The upstream answered with a result of another kind than the request's.
/// A prompt or resource whose text could not be redacted: withheld, never sent raw.
fn withheld(what: &str, name: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("{what} {name}: the result could not be cleaned for the client; withheld"),
        None,
    )
}

/// An upstream answered `method` with a result of another kind.
pub(super) fn unexpected(upstream: &Upstream, method: &str) -> ErrorData {
    ErrorData::internal_error(
        format!(
            "upstream {} answered {method} with something else",
            upstream.name()
        ),
        None,
    )
}
