//! A saver profile: which tables carry a checkpointer's traffic. Profiles
//! are data (TOML files in `rules/`), so supporting another saver with the
//! same schema is a new file, not new code.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

/// The checkpoint tables of one saver.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tables {
    pub checkpoints: String,
    pub blobs: String,
    pub writes: String,
    pub migrations: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileHeader {
    name: String,
    /// Schema the tables live in; unqualified names are accepted too
    /// (they resolve through `search_path`).
    schema: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    profile: ProfileHeader,
    tables: Tables,
}

/// Which checkpoint table a statement addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TableRole {
    Checkpoints,
    Blobs,
    Writes,
    Migrations,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaverProfile {
    pub name: String,
    pub schema: Option<String>,
    pub tables: Tables,
}

impl SaverProfile {
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        let file: ProfileFile = toml::from_str(text)?;
        Ok(SaverProfile {
            name: file.profile.name,
            schema: file.profile.schema,
            tables: file.tables,
        })
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading saver profile {}", path.display()))?;
        Self::from_toml(&text).with_context(|| format!("in saver profile {}", path.display()))
    }

    /// The built-in profile for LangGraph Python, used when no rules
    /// directory is configured.
    pub fn langgraph_python() -> Self {
        SaverProfile {
            name: "langgraph-python".into(),
            schema: None,
            tables: Tables {
                checkpoints: "checkpoints".into(),
                blobs: "checkpoint_blobs".into(),
                writes: "checkpoint_writes".into(),
                migrations: "checkpoint_migrations".into(),
            },
        }
    }

    /// Table names, for the cheap substring prefilter.
    pub fn table_names(&self) -> [&str; 4] {
        [
            &self.tables.checkpoints,
            &self.tables.blobs,
            &self.tables.writes,
            &self.tables.migrations,
        ]
    }

    /// The role of a (possibly schema-qualified) table name, compared the
    /// way PostgreSQL resolves identifiers (`quoted` ones are exact,
    /// unquoted ones fold to lower case).
    pub fn role_of(&self, parts: &[(String, bool)]) -> Option<TableRole> {
        let ((table, table_quoted), schema) = match parts {
            [t] => (t, None),
            [s, t] => (t, Some(s)),
            _ => return None,
        };
        if let (Some((schema, quoted)), Some(want)) = (schema, &self.schema) {
            if !ident_eq(schema, *quoted, want) {
                return None;
            }
        }
        let t = &self.tables;
        [
            (&t.checkpoints, TableRole::Checkpoints),
            (&t.blobs, TableRole::Blobs),
            (&t.writes, TableRole::Writes),
            (&t.migrations, TableRole::Migrations),
        ]
        .into_iter()
        .find(|(name, _)| ident_eq(table, *table_quoted, name))
        .map(|(_, role)| role)
    }
}

fn ident_eq(ident: &str, quoted: bool, want: &str) -> bool {
    if quoted {
        ident == want
    } else {
        ident.eq_ignore_ascii_case(want)
    }
}

/// Loads every `*.toml` profile in a rules directory (sorted by name, so
/// precedence is stable); files of other kinds are left to their loaders.
pub fn load_profiles(dir: &Path) -> anyhow::Result<Vec<SaverProfile>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading rules directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    paths.iter().map(|p| SaverProfile::load(p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(v: &[(&str, bool)]) -> Vec<(String, bool)> {
        v.iter().map(|(s, q)| (s.to_string(), *q)).collect()
    }

    #[test]
    fn shipped_profiles_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
        let profiles = load_profiles(&dir).unwrap();
        let names: Vec<_> = profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["langgraph-js", "langgraph-python"]);
        assert_eq!(profiles[1], SaverProfile::langgraph_python());
    }

    #[test]
    fn resolves_roles_like_postgres() {
        let p = SaverProfile::langgraph_python();
        assert_eq!(
            p.role_of(&parts(&[("CHECKPOINTS", false)])),
            Some(TableRole::Checkpoints)
        );
        assert_eq!(p.role_of(&parts(&[("CHECKPOINTS", true)])), None);
        assert_eq!(
            p.role_of(&parts(&[("public", true), ("checkpoint_writes", true)])),
            Some(TableRole::Writes)
        );
        assert_eq!(p.role_of(&parts(&[("pgbench_accounts", false)])), None);
    }

    #[test]
    fn schema_must_match_when_declared() {
        let mut p = SaverProfile::langgraph_python();
        p.schema = Some("public".into());
        assert_eq!(
            p.role_of(&parts(&[("other", false), ("checkpoints", false)])),
            None
        );
        assert_eq!(
            p.role_of(&parts(&[("public", false), ("checkpoints", false)])),
            Some(TableRole::Checkpoints)
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = SaverProfile::from_toml(
            "[profile]\nname='x'\ncolour='red'\n[tables]\ncheckpoints='a'\nblobs='b'\nwrites='c'\nmigrations='d'\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }
}
