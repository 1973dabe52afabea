// Minimal OpenID Provider for toolgate's console tests (oidc-provider 9.x, Node >= 20.12).
// Usage: PORT=9400 node provider.mjs
//   issuer      http://127.0.0.1:$PORT   (discovery: /.well-known/openid-configuration, JWKS: /jwks)
//   clients     toolgate (confidential, secret "toolgate-secret"), toolgate-public (PKCE only),
//               plus negative-test clients whose ID token is re-signed with a defect (see TAMPER).
//   redirect    http://127.0.0.1/oidc/callback (toolgate console) and /console/oidc/callback
//               (--console beside an MCP endpoint) on ANY port (application_type native => loopback
//               port ignored)
//   login       no UI needed: login_hint=alice|bob on /auth logs that user in; without a hint a
//               one-field HTML form (#username, #login) is shown, which WebDriver can fill in.
//   consent     always granted automatically.
import { generateKeyPairSync } from 'node:crypto';
import Provider from 'oidc-provider';
import * as jose from 'jose'; // a dependency of oidc-provider, already in node_modules

const PORT = Number(process.env.PORT || 9400);
const ISSUER = `http://127.0.0.1:${PORT}`;

const USERS = {
  alice: { email: 'alice@example.test', name: 'Alice Approver', groups: ['toolgate-admins', 'approvers'] },
  bob: { email: 'bob@example.test', name: 'Bob Viewer', groups: ['viewers'] },
};

// Signing key: fixed per process (RS256). Keep the private JWK to re-sign tampered tokens.
const kid = 'test-rs256';
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingJwk = { ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' };
const { privateKey: otherKey } = generateKeyPairSync('rsa', { modulusLength: 2048 }); // not in JWKS

const base = {
  redirect_uris: ['http://127.0.0.1/oidc/callback', 'http://127.0.0.1/console/oidc/callback'],
  application_type: 'native', // loopback redirect: any port allowed (RFC 8252 7.3)
  grant_types: ['authorization_code'],
  response_types: ['code'],
};
const TAMPER = {
  'toolgate-wrong-aud': (p) => ({ ...p, aud: 'someone-else' }),
  'toolgate-expired': (p) => ({ ...p, iat: p.iat - 7200, exp: p.iat - 3600 }),
  'toolgate-wrong-iss': (p) => ({ ...p, iss: 'http://127.0.0.1:1/evil' }),
  'toolgate-wrong-nonce': (p) => ({ ...p, nonce: 'not-the-nonce-you-sent' }),
  'toolgate-bad-sig': null, // same claims, signed with a key that is not in the JWKS
};
const clients = [
  { ...base, client_id: 'toolgate', client_secret: 'toolgate-secret', token_endpoint_auth_method: 'client_secret_basic' },
  { ...base, client_id: 'toolgate-public', token_endpoint_auth_method: 'none' },
  ...Object.keys(TAMPER).map((id) => ({ ...base, client_id: id, client_secret: 'toolgate-secret' })),
];

const provider = new Provider(ISSUER, {
  clients,
  jwks: { keys: [signingJwk] },
  findAccount: async (ctx, sub) => (USERS[sub] ? {
    accountId: sub,
    claims: async () => ({ sub, email_verified: true, ...USERS[sub] }),
  } : undefined),
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'], groups: ['groups'] },
  conformIdTokenClaims: false, // put scope-granted claims (email, name, groups) in the ID token itself
  pkce: { required: () => true }, // S256 is the only method 9.x supports
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  cookies: { keys: ['toolgate-test-cookie-key'] },
  ttl: { IdToken: 3600, AccessToken: 3600, AuthorizationCode: 60, Session: 3600, Interaction: 600, Grant: 3600 },
  renderError: async (ctx, out) => { ctx.type = 'json'; ctx.body = out; },
});

async function readForm(req) {
  let body = '';
  for await (const chunk of req) body += chunk;
  return new URLSearchParams(body);
}

async function finish(ctx, result) {
  const to = await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: false });
  ctx.status = 303;
  ctx.redirect(to);
}

provider.use(async (ctx, next) => {
  const m = ctx.path.match(/^\/interaction\/([\w-]+)(\/login)?$/);
  if (!m) {
    await next();
    // Negative tests: re-sign the ID token of the token response with a defect.
    if (ctx.oidc?.route === 'token' && ctx.body?.id_token && ctx.oidc.client?.clientId in TAMPER) {
      const id = ctx.oidc.client.clientId;
      const payload = jose.decodeJwt(ctx.body.id_token);
      const key = id === 'toolgate-bad-sig' ? otherKey : privateKey;
      const claims = TAMPER[id] ? TAMPER[id](payload) : payload;
      ctx.body = { ...ctx.body, id_token: await new jose.SignJWT(claims).setProtectedHeader({ alg: 'RS256', kid }).sign(key) };
    }
    return;
  }
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const { prompt, params, session } = details;
  if (prompt.name === 'login') {
    let user = params.login_hint;
    if (ctx.method === 'POST' && m[2]) user = (await readForm(ctx.req)).get('username');
    if (user && USERS[user]) return finish(ctx, { login: { accountId: user } });
    ctx.type = 'html';
    ctx.body = `<!doctype html><title>Test IdP login</title><form method="post" action="/interaction/${m[1]}/login">
<input id="username" name="username" autofocus><button id="login" type="submit">Sign in</button></form>`;
    return;
  }
  if (prompt.name === 'consent') {
    const grant = details.grantId ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    grant.addOIDCScope(params.scope);
    return finish(ctx, { consent: { grantId: await grant.save() } });
  }
  ctx.throw(400, `unexpected prompt ${prompt.name}`);
});

provider.listen(PORT, '127.0.0.1', () => console.log(`oidc-provider listening on ${ISSUER}`));
