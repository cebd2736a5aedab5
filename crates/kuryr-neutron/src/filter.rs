//! List filters: `GET /v2.0/{collection}?key=value&...`.

/// A list query. Repeated keys are kept (Neutron ORs repeated values of one attribute and requires one `fields=` per
/// field). Tags are comma-joined as the tag extension expects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pairs: Vec<(String, String)>,
    limit: Option<u32>,
}

impl ListFilter {
    pub fn new() -> Self {
        Self::default()
    }

    /// `key=value`, for any attribute without a dedicated helper.
    pub fn eq(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.pairs.push((key.into(), value.into()));
        self
    }

    pub fn id(self, v: impl Into<String>) -> Self {
        self.eq("id", v)
    }
    pub fn name(self, v: impl Into<String>) -> Self {
        self.eq("name", v)
    }
    pub fn project_id(self, v: impl Into<String>) -> Self {
        self.eq("project_id", v)
    }
    pub fn network_id(self, v: impl Into<String>) -> Self {
        self.eq("network_id", v)
    }
    pub fn device_owner(self, v: impl Into<String>) -> Self {
        self.eq("device_owner", v)
    }
    pub fn device_id(self, v: impl Into<String>) -> Self {
        self.eq("device_id", v)
    }
    pub fn host_id(self, v: impl Into<String>) -> Self {
        self.eq("binding:host_id", v)
    }
    pub fn status(self, v: impl Into<String>) -> Self {
        self.eq("status", v)
    }
    pub fn port_id(self, v: impl Into<String>) -> Self {
        self.eq("port_id", v)
    }
    pub fn security_group_id(self, v: impl Into<String>) -> Self {
        self.eq("security_group_id", v)
    }
    pub fn subnetpool_id(self, v: impl Into<String>) -> Self {
        self.eq("subnetpool_id", v)
    }
    /// Ports holding this fixed IP address.
    pub fn fixed_ip_address(self, ip: impl AsRef<str>) -> Self {
        self.eq("fixed_ips", format!("ip_address={}", ip.as_ref()))
    }
    /// Ports with a fixed IP on this subnet.
    pub fn fixed_ip_subnet(self, subnet_id: impl AsRef<str>) -> Self {
        self.eq("fixed_ips", format!("subnet_id={}", subnet_id.as_ref()))
    }
    /// Resources carrying all of `tags`.
    pub fn tags<I: IntoIterator<Item = S>, S: AsRef<str>>(self, tags: I) -> Self {
        self.tag_filter("tags", tags)
    }
    /// Resources carrying at least one of `tags`.
    pub fn tags_any<I: IntoIterator<Item = S>, S: AsRef<str>>(self, tags: I) -> Self {
        self.tag_filter("tags-any", tags)
    }
    /// Resources not carrying all of `tags`.
    pub fn not_tags<I: IntoIterator<Item = S>, S: AsRef<str>>(self, tags: I) -> Self {
        self.tag_filter("not-tags", tags)
    }
    /// Resources carrying none of `tags`.
    pub fn not_tags_any<I: IntoIterator<Item = S>, S: AsRef<str>>(self, tags: I) -> Self {
        self.tag_filter("not-tags-any", tags)
    }
    /// Only return these attributes (the typed answer defaults the others).
    pub fn fields<I: IntoIterator<Item = S>, S: AsRef<str>>(mut self, fields: I) -> Self {
        for f in fields {
            self.pairs.push(("fields".into(), f.as_ref().to_owned()));
        }
        self
    }
    /// Page size: the server returns at most `n` items per request; the client follows the `next` links.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    fn tag_filter<I: IntoIterator<Item = S>, S: AsRef<str>>(self, key: &str, tags: I) -> Self {
        let joined = tags
            .into_iter()
            .map(|t| t.as_ref().to_owned())
            .collect::<Vec<_>>()
            .join(",");
        self.eq(key, joined)
    }

    /// This filter once per `per` of `values`, each naming its share of them under `key`
    /// (Neutron ORs repeated values): lists by many ids whose requests each stay within a
    /// server's request-line buffer.
    pub fn chunked<S: AsRef<str>>(&self, key: &str, values: &[S], per: usize) -> Vec<ListFilter> {
        values
            .chunks(per.max(1))
            .map(|chunk| chunk.iter().fold(self.clone(), |f, v| f.eq(key, v.as_ref())))
            .collect()
    }

    pub fn page_size(&self) -> Option<u32> {
        self.limit
    }

    /// Query pairs including `limit` (not `marker`).
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let mut v = self.pairs.clone();
        if let Some(l) = self.limit {
            v.push(("limit".into(), l.to_string()));
        }
        v
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn chunked_splits_the_values_and_keeps_the_base() {
        let base = ListFilter::new().eq("status", "ACTIVE");
        let parts = base.chunked("id", &["a", "b", "c"], 2);
        let pairs: Vec<Vec<(String, String)>> = parts.iter().map(ListFilter::to_pairs).collect();
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            pairs,
            [
                vec![p("status", "ACTIVE"), p("id", "a"), p("id", "b")],
                vec![p("status", "ACTIVE"), p("id", "c")],
            ]
        );
        assert!(base.chunked::<&str>("id", &[], 2).is_empty());
    }

    use super::*;

    #[test]
    fn builds_neutron_query_pairs() {
        let f = ListFilter::new()
            .device_owner("compute:kuryr")
            .host_id("n1")
            .fixed_ip_subnet("s1")
            .tags(["a", "b"])
            .not_tags_any(["x"])
            .fields(["id", "status"])
            .limit(10);
        let p = f.to_pairs();
        let as_ref: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            as_ref,
            vec![
                ("device_owner", "compute:kuryr"),
                ("binding:host_id", "n1"),
                ("fixed_ips", "subnet_id=s1"),
                ("tags", "a,b"),
                ("not-tags-any", "x"),
                ("fields", "id"),
                ("fields", "status"),
                ("limit", "10"),
            ]
        );
    }
}
