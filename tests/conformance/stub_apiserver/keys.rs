//! The stub's service-account issuer: signing keys (RS256 or ES256) published as a JWKS, tokens signed
//! with the claims the kube-apiserver puts in bound service-account tokens, and the verification its
//! TokenReview does for its own tokens.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{json, Value};
use stowage::auth::UserInfo;

/// Seconds since the epoch, as JWTs count time.
pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// The service-account uid the stub puts in tokens for `namespace/name`.
pub fn service_account_uid(namespace: &str, name: &str) -> String {
    format!("uid-sa-{namespace}-{name}")
}

/// One signing key.
pub struct SigningKey {
    pub kid: String,
    pub algorithm: Algorithm,
    pub jwk: Jwk,
    pub published: bool,
    encoding: EncodingKey,
}

impl SigningKey {
    /// A fresh RS256 (RSA 2048) or ES256 (P-256) key.
    pub fn generate(algorithm: Algorithm, kid: &str) -> SigningKey {
        let encoding = match algorithm {
            Algorithm::RS256 => {
                let key = rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                    .expect("RSA key");
                EncodingKey::from_rsa_der(&pkcs1_of_pkcs8(&key.serialize_der()))
            }
            Algorithm::ES256 => {
                let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
                EncodingKey::from_ec_der(&key.serialize_der())
            }
            other => panic!("the stub signs with RS256 or ES256, not {other:?}"),
        };
        let mut jwk = Jwk::from_encoding_key(&encoding, algorithm).expect("JWK of the signing key");
        jwk.common.key_id = Some(kid.to_owned());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        jwk.common.key_algorithm = Some(match algorithm {
            Algorithm::ES256 => KeyAlgorithm::ES256,
            _ => KeyAlgorithm::RS256,
        });
        SigningKey { kid: kid.to_owned(), algorithm, jwk, published: true, encoding }
    }

    /// Signs `claims`, naming `kid` in the header (`None`: no `kid` at all).
    pub fn sign(&self, claims: &Value, kid: Option<&str>) -> String {
        let mut header = Header::new(self.algorithm);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign a JWT")
    }
}

/// The PKCS#1 `RSAPrivateKey` inside a PKCS#8 `PrivateKeyInfo` (what aws-lc wants for RS256 signing).
fn pkcs1_of_pkcs8(der: &[u8]) -> Vec<u8> {
    // SEQUENCE { INTEGER version, SEQUENCE algorithm, OCTET STRING privateKey, ... }
    fn read(der: &[u8]) -> (u8, &[u8], &[u8]) {
        let tag = der[0];
        let (len, header) = match der[1] {
            n if n < 0x80 => (n as usize, 2),
            n => {
                let count = (n & 0x7f) as usize;
                let len = der[2..2 + count].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
                (len, 2 + count)
            }
        };
        (tag, &der[header..header + len], &der[header + len..])
    }
    let (tag, body, _) = read(der);
    assert_eq!(tag, 0x30, "PKCS#8 is a SEQUENCE");
    let (_, _, rest) = read(body); // version
    let (_, _, rest) = read(rest); // algorithm
    let (tag, key, _) = read(rest);
    assert_eq!(tag, 0x04, "PKCS#8 privateKey is an OCTET STRING");
    key.to_vec()
}

/// What a service-account token says; [`SaToken::new`] gives the kube-apiserver's defaults.
#[derive(Clone, Debug)]
pub struct SaToken {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub audiences: Vec<String>,
    pub exp: i64,
    pub nbf: Option<i64>,
    pub iat: i64,
    /// `None`: the stub's issuer.
    pub issuer: Option<String>,
    /// `(name, uid)` of the pod, node or secret the token is bound to.
    pub pod: Option<(String, String)>,
    pub node: Option<(String, String)>,
    pub secret: Option<(String, String)>,
    pub jti: Option<String>,
    pub warnafter: Option<i64>,
    /// `None`: the current key's `kid`; `Some("")`: no `kid` in the header.
    pub kid: Option<String>,
}

impl SaToken {
    /// An unbound token for `namespace/name`, for `audiences`, expiring at `exp` (epoch seconds).
    pub fn new(namespace: &str, name: &str, audiences: &[&str], exp: i64) -> SaToken {
        let now = now();
        SaToken {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: service_account_uid(namespace, name),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            exp,
            nbf: Some(now),
            iat: now,
            issuer: None,
            pod: None,
            node: None,
            secret: None,
            jti: Some(format!("jti-{namespace}-{name}-{now}")),
            warnafter: None,
            kid: None,
        }
    }

    /// The JWT claims, `iss` = `issuer` unless overridden.
    pub fn claims(&self, issuer: &str) -> Value {
        let reference = |r: &Option<(String, String)>| r.as_ref().map(|(name, uid)| json!({"name": name, "uid": uid}));
        let mut kubernetes = json!({
            "namespace": self.namespace,
            "serviceaccount": {"name": self.name, "uid": self.uid},
        });
        for (key, value) in
            [("pod", reference(&self.pod)), ("node", reference(&self.node)), ("secret", reference(&self.secret))]
        {
            if let Some(value) = value {
                kubernetes[key] = value;
            }
        }
        if let Some(warnafter) = self.warnafter {
            kubernetes["warnafter"] = json!(warnafter);
        }
        let mut claims = json!({
            "aud": self.audiences,
            "exp": self.exp,
            "iat": self.iat,
            "iss": self.issuer.as_deref().unwrap_or(issuer),
            "sub": format!("system:serviceaccount:{}:{}", self.namespace, self.name),
            "kubernetes.io": kubernetes,
        });
        if let Some(nbf) = self.nbf {
            claims["nbf"] = json!(nbf);
        }
        if let Some(jti) = &self.jti {
            claims["jti"] = json!(jti);
        }
        claims
    }
}

/// The kube-apiserver's TokenReview of one of the stub's own tokens: `Some((user, audiences))` when
/// it is valid for one of `audiences`.
pub fn review(token: &str, keys: &[SigningKey], issuer: &str, audiences: &[String]) -> Option<(UserInfo, Vec<String>)> {
    let header = jsonwebtoken::decode_header(token).ok()?;
    let key = keys.iter().find(|k| k.published && Some(&k.kid) == header.kid.as_ref())?;
    let mut validation = Validation::new(key.algorithm);
    validation.set_issuer(&[issuer]);
    validation.set_audience(audiences);
    validation.validate_nbf = true;
    let decoding = DecodingKey::from_jwk(&key.jwk).ok()?;
    let claims = jsonwebtoken::decode::<Value>(token, &decoding, &validation).ok()?.claims;
    let k = &claims["kubernetes.io"];
    let namespace = k["namespace"].as_str()?;
    let mut extra = BTreeMap::new();
    if let (Some(name), Some(uid)) = (k["pod"]["name"].as_str(), k["pod"]["uid"].as_str()) {
        extra.insert("authentication.kubernetes.io/pod-name".to_owned(), vec![name.to_owned()]);
        extra.insert("authentication.kubernetes.io/pod-uid".to_owned(), vec![uid.to_owned()]);
    }
    if let Some(jti) = claims["jti"].as_str() {
        extra.insert("authentication.kubernetes.io/credential-id".to_owned(), vec![format!("JTI={jti}")]);
    }
    let user = UserInfo {
        name: format!("system:serviceaccount:{namespace}:{}", k["serviceaccount"]["name"].as_str()?),
        uid: k["serviceaccount"]["uid"].as_str()?.to_owned(),
        groups: vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".to_owned(),
        ],
        extra,
    };
    let token_audiences: Vec<String> = match &claims["aud"] {
        Value::String(a) => vec![a.clone()],
        other => serde_json::from_value(other.clone()).unwrap_or_default(),
    };
    let granted = audiences.iter().filter(|a| token_audiences.contains(a)).cloned().collect();
    Some((user, granted))
}
