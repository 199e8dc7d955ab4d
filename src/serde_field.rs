//! Field deserialisers for the config file: errors quote the value and say what was expected
//! (the config loader prefixes the key).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

/// A humantime duration (`"500ms"`, `"2m"`), with an error that quotes the value.
pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|_| {
        serde::de::Error::custom(format!(
            "= {s:?} is not a duration (e.g. \"500ms\", \"30s\", \"2m\", \"1h\")"
        ))
    })
}

struct De<T>(T);

impl<'de> Deserialize<'de> for De<Duration> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        duration(d).map(De)
    }
}

impl<'de> Deserialize<'de> for De<SocketAddr> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        addr(d).map(De)
    }
}

impl<'de> Deserialize<'de> for De<IpNet> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(De).map_err(|_| {
            serde::de::Error::custom(format!(
                "= {s:?} is not a CIDR range (e.g. \"10.1.0.0/16\")"
            ))
        })
    }
}

/// A list of [`duration`]s.
pub fn durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    Vec::<De<Duration>>::deserialize(d).map(|v| v.into_iter().map(|x| x.0).collect())
}

/// A socket address (`ip:port`), with an error that quotes the value.
pub fn addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "= {s:?} is not an address (ip:port, e.g. \"127.0.0.1:8080\")"
        ))
    })
}

/// A list of [`addr`]esses.
pub fn addrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
    Vec::<De<SocketAddr>>::deserialize(d).map(|v| v.into_iter().map(|x| x.0).collect())
}

/// A list of CIDR ranges (`10.1.0.0/16`).
pub fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    Vec::<De<IpNet>>::deserialize(d).map(|v| v.into_iter().map(|x| x.0).collect())
}

/// A map of strings whose values may be written as any TOML scalar: rdkafka properties are
/// strings, but `linger.ms = 0` in TOML is natural.
pub fn string_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        S(String),
        I(i64),
        F(f64),
        B(bool),
    }
    let m = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| {
            let v = match v {
                Scalar::S(s) => s,
                Scalar::I(i) => i.to_string(),
                Scalar::F(f) => f.to_string(),
                Scalar::B(b) => b.to_string(),
            };
            (k, v)
        })
        .collect())
}
