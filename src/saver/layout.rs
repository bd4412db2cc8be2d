//! Row layouts of the checkpoint SELECT's two arrays.
//!
//! The saver's read returns `channel_values` and `pending_writes` as 2-D
//! `bytea[]` values built by `array_agg(array[...])`: one array row per
//! blob or write, its elements the columns listed inside `array[...]`.
//! Saver generations differ in that list (Python 3.x adds `task_path` and
//! `idx` to each write; Python 2.0.x and JS send four elements), so the
//! list is data: each profile declares the layouts it knows, the
//! classifier reads the list off the statement's SQL and picks the
//! declared layout it equals, and rows are decoded by that layout.

use serde::Deserialize;

/// One element of an array row: the `checkpoint_blobs` /
/// `checkpoint_writes` column it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Element {
    TaskId,
    Channel,
    Type,
    Blob,
    TaskPath,
    Idx,
}

impl Element {
    /// The element a column of that name carries, if any.
    pub fn from_column(name: &str) -> Option<Element> {
        Some(match name {
            "task_id" => Element::TaskId,
            "channel" => Element::Channel,
            "type" => Element::Type,
            "blob" => Element::Blob,
            "task_path" => Element::TaskPath,
            "idx" => Element::Idx,
            _ => return None,
        })
    }
}

/// A layout as a profile declares it: which saver generation sends it,
/// and the elements of each row in order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredLayout {
    pub saver: String,
    pub elements: Vec<Element>,
}

/// An element list that is no layout of its array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("element {0:?} does not belong in this array")]
    Foreign(Element),
    #[error("element {0:?} listed twice")]
    Twice(Element),
    #[error("element {0:?} is missing")]
    Missing(Element),
}

/// Where each element sits in one `channel_values` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelValuesLayout {
    pub width: usize,
    pub channel: usize,
    pub type_tag: usize,
    pub blob: usize,
}

impl ChannelValuesLayout {
    /// `[channel, type, blob]`: every known saver.
    pub const STANDARD: ChannelValuesLayout = ChannelValuesLayout {
        width: 3,
        channel: 0,
        type_tag: 1,
        blob: 2,
    };

    /// The positions of a declared element list: exactly `channel`,
    /// `type` and `blob`, in any order.
    pub fn from_elements(elements: &[Element]) -> Result<Self, LayoutError> {
        let at = Positions::of(elements, &[Element::Channel, Element::Type, Element::Blob])?;
        Ok(ChannelValuesLayout {
            width: elements.len(),
            channel: at.required(Element::Channel)?,
            type_tag: at.required(Element::Type)?,
            blob: at.required(Element::Blob)?,
        })
    }
}

/// Where each element sits in one `pending_writes` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingWritesLayout {
    pub width: usize,
    pub task_id: usize,
    pub channel: usize,
    pub type_tag: usize,
    pub blob: usize,
    /// Absent in layouts that do not carry it (the column's default `''`).
    pub task_path: Option<usize>,
    pub idx: Option<usize>,
}

impl PendingWritesLayout {
    /// `[task_id, channel, type, blob, task_path, idx]`: Python 3.x.
    pub const PYTHON_3: PendingWritesLayout = PendingWritesLayout {
        width: 6,
        task_id: 0,
        channel: 1,
        type_tag: 2,
        blob: 3,
        task_path: Some(4),
        idx: Some(5),
    };

    /// `[task_id, channel, type, blob]`: Python 2.0.x and JS 1.0.x.
    pub const FOUR: PendingWritesLayout = PendingWritesLayout {
        width: 4,
        task_id: 0,
        channel: 1,
        type_tag: 2,
        blob: 3,
        task_path: None,
        idx: None,
    };

    /// The positions of a declared element list: `task_id`, `channel`,
    /// `type` and `blob`, optionally `task_path` and `idx`, in any order.
    pub fn from_elements(elements: &[Element]) -> Result<Self, LayoutError> {
        use Element::*;
        let at = Positions::of(elements, &[TaskId, Channel, Type, Blob, TaskPath, Idx])?;
        Ok(PendingWritesLayout {
            width: elements.len(),
            task_id: at.required(TaskId)?,
            channel: at.required(Channel)?,
            type_tag: at.required(Type)?,
            blob: at.required(Blob)?,
            task_path: at.get(TaskPath),
            idx: at.get(Idx),
        })
    }
}

/// An element list checked for allowed and duplicate elements.
struct Positions<'a>(&'a [Element]);

impl<'a> Positions<'a> {
    fn of(elements: &'a [Element], allowed: &[Element]) -> Result<Self, LayoutError> {
        for (i, e) in elements.iter().enumerate() {
            if !allowed.contains(e) {
                return Err(LayoutError::Foreign(*e));
            }
            if elements[..i].contains(e) {
                return Err(LayoutError::Twice(*e));
            }
        }
        Ok(Positions(elements))
    }

    fn get(&self, e: Element) -> Option<usize> {
        self.0.iter().position(|x| *x == e)
    }

    fn required(&self, e: Element) -> Result<usize, LayoutError> {
        self.get(e).ok_or(LayoutError::Missing(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Element::*;

    #[test]
    fn known_generations() {
        assert_eq!(
            PendingWritesLayout::from_elements(&[TaskId, Channel, Type, Blob, TaskPath, Idx]),
            Ok(PendingWritesLayout::PYTHON_3)
        );
        assert_eq!(
            PendingWritesLayout::from_elements(&[TaskId, Channel, Type, Blob]),
            Ok(PendingWritesLayout::FOUR)
        );
        assert_eq!(
            ChannelValuesLayout::from_elements(&[Channel, Type, Blob]),
            Ok(ChannelValuesLayout::STANDARD)
        );
    }

    #[test]
    fn any_order_but_nothing_missing_twice_or_foreign() {
        let l = PendingWritesLayout::from_elements(&[Idx, Blob, Channel, TaskId, Type]).unwrap();
        assert_eq!(
            (l.width, l.idx, l.blob, l.task_id, l.task_path),
            (5, Some(0), 1, 3, None)
        );
        let missing = PendingWritesLayout::from_elements(&[TaskId, Channel, Type])
            .unwrap_err()
            .to_string();
        assert!(missing.contains("Blob"), "{missing}");
        let twice = ChannelValuesLayout::from_elements(&[Channel, Type, Blob, Blob])
            .unwrap_err()
            .to_string();
        assert!(twice.contains("twice"), "{twice}");
        let foreign = ChannelValuesLayout::from_elements(&[Channel, Type, Blob, Idx])
            .unwrap_err()
            .to_string();
        assert!(foreign.contains("Idx"), "{foreign}");
    }

    #[test]
    fn column_names() {
        assert_eq!(Element::from_column("task_path"), Some(TaskPath));
        assert_eq!(Element::from_column("version"), None);
    }
}
