// Aligned plain-text table: a header row and data rows, columns separated by two spaces, numbers
// right-aligned, no trailing blanks. Widths count UTF-8 code points, not bytes.
#ifndef TIER_TIERCTL_TABLE_H_
#define TIER_TIERCTL_TABLE_H_

#include <ostream>
#include <string>
#include <vector>

namespace tier::ctl {

class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
  };

  explicit Table(std::vector<Column> columns);

  // Missing cells render empty; cells beyond the column count are dropped.
  void AddRow(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }
  void Render(std::ostream& out) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_TABLE_H_
