#include "tierctl/table.h"

#include <sstream>

#include "gtest/gtest.h"

namespace tier::ctl {
namespace {

using Align = Table::Align;

std::string Render(const Table& table) {
  std::ostringstream out;
  table.Render(out);
  return out.str();
}

TEST(TableTest, AlignsColumnsLeftAndRight) {
  Table table({{"NAME"}, {"SIZE", Align::kRight}, {"N", Align::kRight}});
  table.AddRow({"host", "64.0 GiB", "7"});
  table.AddRow({"nvme-long", "1.0 KiB", "12345"});
  EXPECT_EQ(Render(table),
            "NAME           SIZE      N\n"
            "host       64.0 GiB      7\n"
            "nvme-long   1.0 KiB  12345\n");
}

TEST(TableTest, NoTrailingBlanksAfterALeftAlignedLastColumn) {
  Table table({{"ID", Align::kRight}, {"NAME"}});
  table.AddRow({"1", "a"});
  table.AddRow({"22", "longer"});
  EXPECT_EQ(Render(table),
            "ID  NAME\n"
            " 1  a\n"
            "22  longer\n");
}

TEST(TableTest, MissingCellsAreEmptyAndExtraCellsDropped) {
  Table table({{"A"}, {"B", Align::kRight}});
  table.AddRow({"x"});
  table.AddRow({"y", "2", "dropped"});
  EXPECT_EQ(table.rows(), 2u);
  EXPECT_EQ(Render(table),
            "A  B\n"
            "x\n"
            "y  2\n");
}

TEST(TableTest, WidthCountsCodePointsNotBytes) {
  Table table({{"NAME"}, {"N", Align::kRight}});
  table.AddRow({"h\xC3\xA9llo", "1"});  // "héllo": 5 code points, 6 bytes
  table.AddRow({"abc", "2"});
  EXPECT_EQ(Render(table),
            "NAME   N\n"
            "h\xC3\xA9llo  1\n"
            "abc    2\n");
}

TEST(TableTest, HeaderOnlyWhenNoRows) {
  Table table({{"TIER"}, {"USED", Align::kRight}});
  EXPECT_EQ(Render(table), "TIER  USED\n");
}

}  // namespace
}  // namespace tier::ctl
