//! A saver profile: which tables carry a checkpointer's traffic and how
//! its checkpoint read lays out each row of its arrays. Profiles are data
//! (TOML files in `rules/`, the shipped ones also built in), so supporting
//! another saver with the same columns is a new file, not new code.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::layout::{
    ChannelValuesLayout, DeclaredLayout, Element, LayoutError, PendingWritesLayout,
};

/// A saver profile that does not load, with the file it came from.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A row array with no layout declared for it.
    #[error("rows.{column}: no layout declared")]
    NoLayout { column: &'static str },
    /// A declared row layout that cannot decode the saver's rows.
    #[error("rows.{column} (saver {saver}): {layout}")]
    Layout {
        column: &'static str,
        saver: String,
        layout: LayoutError,
    },
    #[error("reading saver profile {}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("in saver profile {}", .path.display())]
    In {
        path: PathBuf,
        source: Box<ProfileError>,
    },
    #[error("reading rules directory {}", .dir.display())]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}

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
    /// The saver always schema-qualifies its table names: a qualified name
    /// fits this profile better than one that does not.
    #[serde(default)]
    qualified_names: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclaredRows {
    channel_values: Vec<DeclaredLayout>,
    pending_writes: Vec<DeclaredLayout>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    profile: ProfileHeader,
    tables: Tables,
    rows: DeclaredRows,
}

/// A declared layout with its element positions worked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownLayout<L> {
    /// The saver generation that sends it, as the profile names it.
    pub saver: String,
    pub elements: Vec<Element>,
    pub layout: L,
}

/// The array row layouts a profile knows, in declaration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayouts {
    pub channel_values: Vec<KnownLayout<ChannelValuesLayout>>,
    pub pending_writes: Vec<KnownLayout<PendingWritesLayout>>,
}

impl RowLayouts {
    fn from_declared(rows: DeclaredRows) -> Result<Self, ProfileError> {
        fn known<L>(
            declared: Vec<DeclaredLayout>,
            column: &'static str,
            positions: fn(&[Element]) -> Result<L, LayoutError>,
        ) -> Result<Vec<KnownLayout<L>>, ProfileError> {
            if declared.is_empty() {
                return Err(ProfileError::NoLayout { column });
            }
            declared
                .into_iter()
                .map(|d| {
                    let layout = match positions(&d.elements) {
                        Ok(layout) => layout,
                        Err(layout) => {
                            return Err(ProfileError::Layout {
                                column,
                                saver: d.saver,
                                layout,
                            })
                        }
                    };
                    Ok(KnownLayout {
                        saver: d.saver,
                        elements: d.elements,
                        layout,
                    })
                })
                .collect()
        }
        Ok(RowLayouts {
            channel_values: known(
                rows.channel_values,
                "channel_values",
                ChannelValuesLayout::from_elements,
            )?,
            pending_writes: known(
                rows.pending_writes,
                "pending_writes",
                PendingWritesLayout::from_elements,
            )?,
        })
    }
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
    pub qualified_names: bool,
    pub tables: Tables,
    pub rows: RowLayouts,
}

/// The shipped profiles, compiled in: used when no rules directory (or
/// one without profiles) is configured.
const BUILT_IN: [(&str, &str); 2] = [
    (
        "rules/langgraph-js.toml",
        include_str!("../../rules/langgraph-js.toml"),
    ),
    (
        "rules/langgraph-python.toml",
        include_str!("../../rules/langgraph-python.toml"),
    ),
];

impl SaverProfile {
    pub fn from_toml(text: &str) -> Result<Self, ProfileError> {
        let file: ProfileFile = toml::from_str(text)?;
        let rows = RowLayouts::from_declared(file.rows)?;
        Ok(SaverProfile {
            name: file.profile.name,
            schema: file.profile.schema,
            qualified_names: file.profile.qualified_names,
            tables: file.tables,
            rows,
        })
    }

    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| ProfileError::In {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Every shipped profile (LangGraph JS and Python), in file-name order.
    pub fn built_in() -> Vec<SaverProfile> {
        BUILT_IN
            .iter()
            .map(|(file, text)| {
                // The shipped files are fixed at compile time and parsed by
                // `built_in_profiles_are_the_shipped_files`.
                Self::from_toml(text).unwrap_or_else(|e| panic!("built-in {file}: {e}"))
            })
            .collect()
    }

    /// The built-in LangGraph Python profile (3.x and 2.0.x).
    pub fn langgraph_python() -> Self {
        Self::built_in_named("langgraph-python")
    }

    /// The built-in LangGraph JS profile (1.0.x).
    pub fn langgraph_js() -> Self {
        Self::built_in_named("langgraph-js")
    }

    fn built_in_named(name: &str) -> Self {
        Self::built_in()
            .into_iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no built-in profile {name}"))
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

impl SaverProfile {
    /// Whether a table name is written the way this saver writes its own:
    /// qualified or not as the profile says (and in its declared schema).
    /// Decides between profiles that all accept a statement.
    pub fn fits_exactly(&self, parts: &[(String, bool)]) -> bool {
        match parts {
            [_] => !self.qualified_names && self.schema.is_none(),
            [(schema, quoted), _] => match &self.schema {
                Some(want) => ident_eq(schema, *quoted, want),
                None => self.qualified_names,
            },
            _ => false,
        }
    }
}

fn ident_eq(ident: &str, quoted: bool, want: &str) -> bool {
    if quoted {
        ident == want
    } else {
        ident.eq_ignore_ascii_case(want)
    }
}

/// The profiles of a rules directory, or the built-in ones when it
/// declares none (a directory of channel rules alone still enforces the
/// shipped savers' traffic).
pub fn profiles_for(dir: Option<&Path>) -> Result<Vec<SaverProfile>, ProfileError> {
    let loaded = match dir {
        Some(dir) => load_profiles(dir)?,
        None => Vec::new(),
    };
    if !loaded.is_empty() {
        return Ok(loaded);
    }
    if let Some(dir) = dir {
        tracing::info!(
            dir = %dir.display(),
            "no saver profile (*.toml) in the rules directory: using the built-in ones"
        );
    }
    Ok(SaverProfile::built_in())
}

/// Loads every `*.toml` profile in a rules directory (sorted by name, so
/// precedence is stable); files of other kinds are left to their loaders.
pub fn load_profiles(dir: &Path) -> Result<Vec<SaverProfile>, ProfileError> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| ProfileError::ReadDir {
            dir: dir.to_path_buf(),
            source,
        })?
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
    fn built_in_profiles_are_the_shipped_files() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
        let profiles = load_profiles(&dir).unwrap();
        let names: Vec<_> = profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["langgraph-js", "langgraph-python"]);
        assert_eq!(profiles, SaverProfile::built_in());
        assert_eq!(profiles[0], SaverProfile::langgraph_js());
        assert_eq!(profiles[1], SaverProfile::langgraph_python());
    }

    #[test]
    fn shipped_layouts() {
        let py = SaverProfile::langgraph_python();
        let writes: Vec<_> = py
            .rows
            .pending_writes
            .iter()
            .map(|k| (k.saver.as_str(), k.layout))
            .collect();
        assert_eq!(
            writes,
            [
                ("3.x", PendingWritesLayout::PYTHON_3),
                ("2.0.x", PendingWritesLayout::FOUR)
            ]
        );
        let js = SaverProfile::langgraph_js();
        assert_eq!(js.rows.pending_writes[0].layout, PendingWritesLayout::FOUR);
        assert!(js.qualified_names && js.schema.is_none());
        for p in [py, js] {
            assert_eq!(
                p.rows.channel_values[0].layout,
                ChannelValuesLayout::STANDARD
            );
        }
    }

    #[test]
    fn a_name_fits_the_saver_that_writes_it_that_way() {
        let (py, js) = (
            SaverProfile::langgraph_python(),
            SaverProfile::langgraph_js(),
        );
        let bare = parts(&[("checkpoints", false)]);
        let qualified = parts(&[("custom_schema", true), ("checkpoints", false)]);
        // Both accept both (search_path; any schema), each fits one.
        for p in [&py, &js] {
            assert!(p.role_of(&bare).is_some() && p.role_of(&qualified).is_some());
        }
        assert!(py.fits_exactly(&bare) && !py.fits_exactly(&qualified));
        assert!(js.fits_exactly(&qualified) && !js.fits_exactly(&bare));
        let mut pinned = SaverProfile::langgraph_js();
        pinned.schema = Some("public".into());
        assert!(!pinned.fits_exactly(&qualified));
        assert!(pinned.fits_exactly(&parts(&[("public", true), ("checkpoints", false)])));
    }

    #[test]
    fn bad_row_layouts_are_load_errors() {
        let text = include_str!("../../rules/langgraph-js.toml");
        let err = SaverProfile::from_toml(&text.replace(
            "[\"task_id\", \"channel\", \"type\", \"blob\"]",
            "[\"task_id\", \"channel\", \"blob\"]",
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "rows.pending_writes (saver 1.0.x): element Type is missing"
        );
        let err =
            SaverProfile::from_toml(&text.replace("\"type\", \"blob\"]", "\"kind\", \"blob\"]"))
                .unwrap_err();
        assert!(format!("{err:#}").contains("kind"), "{err:#}");
        let err = SaverProfile::from_toml(&text.replace(
            "pending_writes = [\n    { saver = \"1.0.x\", elements = [\"task_id\", \"channel\", \"type\", \"blob\"] },\n]",
            "pending_writes = []",
        ))
        .unwrap_err();
        assert_eq!(err.to_string(), "rows.pending_writes: no layout declared");
    }

    #[test]
    fn a_bad_profile_file_is_named_in_its_error() {
        let dir = std::env::temp_dir().join(format!("rg-bad-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("broken.toml");
        std::fs::write(&file, "[profile]\nname = 1\n").unwrap();
        let err = load_profiles(&dir).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        match &err {
            ProfileError::In { path, source } => {
                assert_eq!(path, &file);
                assert!(matches!(**source, ProfileError::Toml(_)), "{source:?}");
            }
            other => panic!("{other:?}"),
        }
        let shown = crate::error_chain::chain(&err).to_string();
        assert!(
            shown.starts_with(&format!("in saver profile {}: ", file.display())),
            "{shown}"
        );
        let err = load_profiles(&dir).unwrap_err();
        assert!(
            matches!(&err, ProfileError::ReadDir { dir: d, .. } if *d == dir),
            "{err:?}"
        );
    }

    #[test]
    fn a_rules_dir_without_profiles_gets_the_built_in_ones() {
        let dir = std::env::temp_dir().join(format!("rg-profiles-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("channels")).unwrap();
        assert_eq!(profiles_for(Some(&dir)).unwrap(), SaverProfile::built_in());
        assert_eq!(profiles_for(None).unwrap(), SaverProfile::built_in());
        let own = include_str!("../../rules/langgraph-python.toml")
            .replace("name = \"langgraph-python\"", "name = \"mine\"");
        std::fs::write(dir.join("mine.toml"), own).unwrap();
        let loaded = profiles_for(Some(&dir)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<_> = loaded.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["mine"]);
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
            &include_str!("../../rules/langgraph-python.toml")
                .replace("[profile]\n", "[profile]\ncolour = 'red'\n"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }
}
