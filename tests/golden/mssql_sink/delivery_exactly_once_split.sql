SET NOCOUNT ON;
SET XACT_ABORT ON;
DECLARE @stored bigint, @status int = 0;
BEGIN TRANSACTION;
SELECT @stored = [token] FROM [Sales Ünïcode].[sql_pseudo_trigger_fence] WITH (UPDLOCK, HOLDLOCK) WHERE [function] = @P1;
IF @stored > @P2 SET @status = 1;
IF @status = 0 AND @stored IS NULL INSERT INTO [Sales Ünïcode].[sql_pseudo_trigger_fence] ([function], [token], [updated_at]) VALUES (@P1, @P2, SYSUTCDATETIME());
IF @status = 0 AND @stored IS NOT NULL UPDATE [Sales Ünïcode].[sql_pseudo_trigger_fence] SET [token] = @P2, [updated_at] = SYSUTCDATETIME() WHERE [function] = @P1;
IF @status = 0 AND EXISTS (SELECT * FROM [Sales Ünïcode].[sql_pseudo_trigger_checkpoint] WITH (UPDLOCK, HOLDLOCK) WHERE [function] = @P1 AND [batch_id] = @P3 AND [from_position] = @P4 COLLATE Latin1_General_100_BIN2 AND [to_position] = @P5 COLLATE Latin1_General_100_BIN2) SET @status = 2;
IF @status = 0
BEGIN
DELETE t FROM [Sales Ünïcode].[Order]] Lines] AS t INNER JOIN OPENJSON(@P7) WITH ([Id] bigint N'$."Id"', [Line] int N'$."Line"') AS d ON t.[Id] = d.[Id] AND t.[Line] = d.[Line];
MERGE INTO [Sales Ünïcode].[Order]] Lines] WITH (HOLDLOCK) AS t USING OPENJSON(@P8) WITH ([Id] bigint N'$."Id"', [Line] int N'$."Line"', [order] nvarchar(max) N'$."order"', [#json2] nvarchar(max) N'$."order"' AS JSON, [Qty "x"] decimal(12, 2) N'$."Qty \"x\""', [Photo] varbinary(max) N'$."Photo"') AS s ON t.[Id] = s.[Id] AND t.[Line] = s.[Line] WHEN MATCHED THEN UPDATE SET t.[order] = COALESCE(s.[order], s.[#json2]), t.[Qty "x"] = s.[Qty "x"], t.[Photo] = s.[Photo] WHEN NOT MATCHED THEN INSERT ([Id], [Line], [order], [Qty "x"], [Photo]) VALUES (s.[Id], s.[Line], COALESCE(s.[order], s.[#json2]), s.[Qty "x"], s.[Photo]);
MERGE INTO [Sales Ünïcode].[Order]] Lines] WITH (HOLDLOCK) AS t USING OPENJSON(@P9) WITH ([Id] bigint N'$."Id"', [Line] int N'$."Line"', [order] nvarchar(max) N'$."order"', [#json2] nvarchar(max) N'$."order"' AS JSON, [Qty "x"] decimal(12, 2) N'$."Qty \"x\""', [Photo] varbinary(max) N'$."Photo"') AS s ON t.[Id] = s.[Id] AND t.[Line] = s.[Line] WHEN MATCHED THEN UPDATE SET t.[order] = COALESCE(s.[order], s.[#json2]), t.[Qty "x"] = s.[Qty "x"], t.[Photo] = s.[Photo] WHEN NOT MATCHED THEN INSERT ([Id], [Line], [order], [Qty "x"], [Photo]) VALUES (s.[Id], s.[Line], COALESCE(s.[order], s.[#json2]), s.[Qty "x"], s.[Photo]);
MERGE INTO [Sales Ünïcode].[Order]] Lines] WITH (HOLDLOCK) AS t USING OPENJSON(@P10) WITH ([Id] bigint N'$."Id"', [Line] int N'$."Line"', [order] nvarchar(max) N'$."order"', [#json2] nvarchar(max) N'$."order"' AS JSON, [Qty "x"] decimal(12, 2) N'$."Qty \"x\""', [Photo] varbinary(max) N'$."Photo"') AS s ON t.[Id] = s.[Id] AND t.[Line] = s.[Line] WHEN MATCHED THEN UPDATE SET t.[order] = COALESCE(s.[order], s.[#json2]), t.[Qty "x"] = s.[Qty "x"], t.[Photo] = s.[Photo] WHEN NOT MATCHED THEN INSERT ([Id], [Line], [order], [Qty "x"], [Photo]) VALUES (s.[Id], s.[Line], COALESCE(s.[order], s.[#json2]), s.[Qty "x"], s.[Photo]);
MERGE INTO [Sales Ünïcode].[sql_pseudo_trigger_checkpoint] WITH (HOLDLOCK) AS c USING (SELECT @P1 AS [function]) AS s ON c.[function] = s.[function] WHEN MATCHED THEN UPDATE SET [batch_id] = @P3, [from_position] = @P4, [to_position] = @P5, [fence] = @P2, [rows] = @P6, [applied_at] = SYSUTCDATETIME() WHEN NOT MATCHED THEN INSERT ([function], [batch_id], [from_position], [to_position], [fence], [rows], [applied_at]) VALUES (@P1, @P3, @P4, @P5, @P2, @P6, SYSUTCDATETIME());
END
IF @status = 1 ROLLBACK TRANSACTION; ELSE COMMIT TRANSACTION;
SELECT @status AS [status], @stored AS [stored];