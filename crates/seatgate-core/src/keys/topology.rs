//! Where a deployment's requests go and its replies come back: the requests
//! stream and its shards, the applications that have streams of their own,
//! the admin stream and the reply namespace. The workers read it from their
//! settings and record it in the deployment's HASH (`<prefix>:config`,
//! [`super::Keys::deployment`]); a client reads it from there, so that a
//! program names only its Redis and its application.

use super::{shard_name, shard_names};

/// The request and reply streams of one deployment, and which application
/// sends on which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The shared requests stream (its unsharded name, `stream.requests`).
    pub requests: String,
    /// Shards of every requests stream (`stream.shards`, at least 1).
    pub shards: usize,
    /// Applications with a requests stream of their own,
    /// `<requests>:app:<app>` (`stream.applications`).
    pub applications: Vec<String>,
    /// The administrators' stream, where only revokes are accepted
    /// (`stream.admin_requests`, never sharded).
    pub admin_requests: String,
    /// The reply namespace (`replies.prefix`): every reply stream's name starts with it.
    pub replies_prefix: String,
}

/// The deployment HASH's field for each part of a [`Topology`].
const SHARDS: &str = "shards";
const REQUESTS: &str = "requests";
const APPLICATIONS: &str = "applications";
const ADMIN_REQUESTS: &str = "admin_requests";
const REPLIES_PREFIX: &str = "replies_prefix";
/// The deployment HASH's field for how many ways the events stream is
/// sharded (`events.shards`, or `stream.shards` when that is 0): where
/// readers of the events find them, whatever the requests streams' count.
pub const EVENTS_SHARDS: &str = "events_shards";

impl Default for Topology {
    /// The shipped settings' topology (config/default.toml): one shared,
    /// unsharded stream, no application streams.
    fn default() -> Topology {
        Topology {
            requests: "seat:requests".to_owned(),
            shards: 1,
            applications: Vec::new(),
            admin_requests: "seat:admin:requests".to_owned(),
            replies_prefix: "seat:reply:".to_owned(),
        }
    }
}

impl Topology {
    /// The deployment HASH's fields, in the order [`Topology::FIELDS`] names them.
    pub const FIELDS: [&'static str; 5] = [SHARDS, REQUESTS, APPLICATIONS, ADMIN_REQUESTS, REPLIES_PREFIX];

    /// The fields a worker records (HSET) besides `shards`, which it sets only
    /// when none is recorded (a worker with another count refuses to run).
    pub fn recorded_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            (REQUESTS, self.requests.clone()),
            (APPLICATIONS, self.applications.join(",")),
            (ADMIN_REQUESTS, self.admin_requests.clone()),
            (REPLIES_PREFIX, self.replies_prefix.clone()),
        ]
    }

    /// The topology the deployment HASH records, its values as HMGET
    /// answered them for [`Topology::FIELDS`]: a field not recorded (a
    /// deployment no worker of this version has started yet) keeps its
    /// default. A shard count that is not a positive number is an error,
    /// naming the field.
    pub fn from_recorded(values: &[Option<String>]) -> Result<Topology, String> {
        let mut topology = Topology::default();
        let value = |i: usize| values.get(i).cloned().flatten().filter(|v| !v.is_empty());
        if let Some(raw) = value(0) {
            topology.shards = raw
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("field {SHARDS} is {raw:?}, not a positive number"))?;
        }
        if let Some(requests) = value(1) {
            topology.requests = requests;
        }
        if let Some(apps) = values.get(2).cloned().flatten() {
            topology.applications = apps
                .split(',')
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(admin) = value(3) {
            topology.admin_requests = admin;
        }
        if let Some(prefix) = value(4) {
            topology.replies_prefix = prefix;
        }
        Ok(topology)
    }

    /// The requests stream of application `app` (unsharded name):
    /// `<requests>:app:<app>`.
    pub fn app_requests(&self, app: &str) -> String {
        format!("{}:app:{app}", self.requests)
    }

    /// The requests stream application `app` sends to (unsharded name): its
    /// own when it is one of [`Topology::applications`], else the shared one.
    pub fn client_requests(&self, app: &str) -> String {
        if self.applications.iter().any(|a| a == app) {
            self.app_requests(app)
        } else {
            self.requests.clone()
        }
    }

    /// The shard of unsharded requests stream `base` that serves `license`.
    pub fn shard_for(&self, base: &str, license: &str) -> String {
        shard_name(base, self.shards, license)
    }

    /// Every requests stream shard: the shared stream's, then each
    /// application's, sharded the same way.
    pub fn request_streams(&self) -> Vec<String> {
        let mut streams = shard_names(&self.requests, self.shards);
        for app in &self.applications {
            streams.extend(shard_names(&self.app_requests(app), self.shards));
        }
        streams
    }

    /// Every requests stream the workers read: the shards and, when
    /// sharded, each unsharded name too, so that a request sent there by a
    /// client that does not shard is answered all the same.
    pub fn read_streams(&self) -> Vec<String> {
        let mut streams = self.request_streams();
        if self.shards > 1 {
            streams.push(self.requests.clone());
            streams.extend(self.applications.iter().map(|app| self.app_requests(app)));
        }
        streams
    }

    /// The application whose own requests stream (or shard of it) `stream` is.
    pub fn application_of(&self, stream: &str) -> Option<&str> {
        self.applications.iter().map(String::as_str).find(|app| {
            let base = self.app_requests(app);
            stream == base || shard_names(&base, self.shards).iter().any(|s| s == stream)
        })
    }

    /// The reply namespace of requests read from `stream`:
    /// `<replies_prefix><app>:` on application `app`'s own stream, so that
    /// no application can have replies written into another's reply
    /// streams; `replies_prefix` on any other.
    pub fn reply_prefix_for(&self, stream: &str) -> String {
        self.reply_prefix_of(self.application_of(stream))
    }

    /// The reply namespace of application `app`'s requests,
    /// `<replies_prefix><app>:`, or of the shared stream's (`None`).
    pub fn reply_prefix_of(&self, app: Option<&str>) -> String {
        match app {
            Some(app) => format!("{}{app}:", self.replies_prefix),
            None => self.replies_prefix.clone(),
        }
    }

    /// A reply stream of client `name` (an application, or `admin`) inside
    /// the namespace its replies are written in: `<replies_prefix><name>:<unique>`.
    pub fn reply_stream(&self, name: &str, unique: &str) -> String {
        format!("{}{name}:{unique}", self.replies_prefix)
    }

    /// What tells requests stream `stream` apart in the dedupe key of an
    /// entry read there (entry ids are unique per stream only,
    /// `request::EntryAt`): `None` for the shared stream itself, `<i>` for
    /// its shard i, `app:<app>` for an application's stream and
    /// `app:<app>:<i>` for its shard i.
    pub fn stream_tag(&self, stream: &str) -> Option<String> {
        let shard = |base: &str| {
            if self.shards <= 1 {
                return None;
            }
            shard_names(base, self.shards)
                .iter()
                .position(|name| name == stream)
        };
        if let Some(app) = self.application_of(stream) {
            return Some(match shard(&self.app_requests(app)) {
                Some(i) => format!("app:{app}:{i}"),
                None => format!("app:{app}"),
            });
        }
        shard(&self.requests).map(|i| i.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_apps() -> Topology {
        Topology {
            shards: 2,
            applications: vec!["demo".into(), "billing".into()],
            ..Topology::default()
        }
    }

    #[test]
    fn what_a_worker_records_reads_back_as_the_same_topology() {
        let t = two_apps();
        let mut values = vec![Some(t.shards.to_string())];
        values.extend(t.recorded_fields().into_iter().map(|(_, v)| Some(v)));
        assert_eq!(Topology::from_recorded(&values), Ok(t));
        assert_eq!(Topology::from_recorded(&[]), Ok(Topology::default()));
        let bad = Topology::from_recorded(&[Some("0".into())]).unwrap_err();
        assert!(bad.contains("shards"), "{bad}");
    }

    #[test]
    fn applications_send_on_their_own_streams_and_are_answered_in_their_own_namespace() {
        let t = two_apps();
        assert_eq!(t.client_requests("demo"), "seat:requests:app:demo");
        assert_eq!(t.client_requests("other"), "seat:requests");
        let shard = t.shard_for(&t.client_requests("demo"), "cad");
        assert!(shard.starts_with("seat:requests:app:demo:{"), "{shard}");
        assert_eq!(t.application_of(&shard), Some("demo"));
        assert_eq!(t.reply_prefix_for(&shard), "seat:reply:demo:");
        assert_eq!(t.reply_prefix_for("seat:requests"), "seat:reply:");
        assert_eq!(t.reply_stream("demo", "x"), "seat:reply:demo:x");
        assert_eq!(t.stream_tag("seat:requests"), None);
        assert_eq!(t.stream_tag("seat:requests:{1}").as_deref(), Some("1"));
        assert_eq!(
            t.stream_tag("seat:requests:app:demo").as_deref(),
            Some("app:demo")
        );
        assert_eq!(t.read_streams().len(), 2 * 3 + 3);
    }
}
